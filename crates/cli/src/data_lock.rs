//! One process per data directory: an exclusive `flock` on `<data_dir>/lock`, held
//! for the process lifetime, with the holder's pid written in the file for the refusal message.

use std::io::{Read, Seek, Write};
use std::path::Path;

/// The held lock; released when dropped (or when the process ends, however it ends).
#[derive(Debug)]
pub struct DataDirLock {
    _file: std::fs::File,
}

/// Creates `dir` if needed and takes the exclusive lock on `<dir>/lock` without waiting. Errors: the
/// directory is held by another process (naming the directory and, when recorded, that pid), or the
/// lock file cannot be created.
pub fn acquire(dir: &Path) -> anyhow::Result<DataDirLock> {
    tb_store::create_private_dir(dir)
        .map_err(|e| anyhow::anyhow!("cannot create data dir {}: {e}", dir.display()))?;
    let path = dir.join("lock");
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)
        .map_err(|e| anyhow::anyhow!("cannot open lock file {}: {e}", path.display()))?;
    flock_exclusive(&file).map_err(|e| {
        let mut pid = String::new();
        let _ = file.read_to_string(&mut pid);
        let pid = pid.trim();
        let by = if pid.is_empty() {
            "another process".to_string()
        } else {
            format!("another process (pid {pid})")
        };
        if e.kind() == std::io::ErrorKind::WouldBlock {
            anyhow::anyhow!(
                "data dir {} is in use by {by}: only one trigger-bridge may use a data dir; stop it or pass another --data-dir",
                dir.display()
            )
        } else {
            anyhow::anyhow!("cannot lock {}: {e}", path.display())
        }
    })?;
    file.set_len(0)?;
    file.rewind()?;
    writeln!(file, "{}", std::process::id())?;
    file.flush()?;
    Ok(DataDirLock { _file: file })
}

#[cfg(unix)]
fn flock_exclusive(file: &std::fs::File) -> std::io::Result<()> {
    use std::os::unix::io::AsRawFd;
    // SAFETY: flock on a descriptor this File owns; no memory is shared.
    let r = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    if r == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

#[cfg(not(unix))]
fn flock_exclusive(_file: &std::fs::File) -> std::io::Result<()> {
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_lock_on_the_same_dir_is_refused_with_the_dir_and_pid() {
        let dir = tempfile::tempdir().unwrap();
        let held = acquire(dir.path()).unwrap();
        let err = acquire(dir.path()).unwrap_err().to_string();
        assert!(err.contains(&dir.path().display().to_string()), "{err}");
        assert!(
            err.contains(&format!("pid {}", std::process::id())),
            "{err}"
        );
        drop(held);
        acquire(dir.path()).unwrap();
    }
}
