//! `trigger-bridge completions bash|zsh|fish`: prints a shell completion script for every subcommand
//! and flag, generated from the CLI definition by `clap_complete`.
//!
//! Install, e.g.: bash `trigger-bridge completions bash > ~/.local/share/bash-completion/completions/trigger-bridge`;
//! zsh `trigger-bridge completions zsh > "${fpath[1]}/_trigger-bridge"`; fish
//! `trigger-bridge completions fish > ~/.config/fish/completions/trigger-bridge.fish`.

use clap::CommandFactory;
use clap_complete::Shell;

/// The shells a script can be printed for.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum CompletionShell {
    Bash,
    Zsh,
    Fish,
}

/// Writes the completion script of `C` (binary name `trigger-bridge`) for `shell` to `out`.
pub fn write<C: CommandFactory>(shell: CompletionShell, out: &mut dyn std::io::Write) {
    let shell = match shell {
        CompletionShell::Bash => Shell::Bash,
        CompletionShell::Zsh => Shell::Zsh,
        CompletionShell::Fish => Shell::Fish,
    };
    clap_complete::generate(shell, &mut C::command(), "trigger-bridge", out);
}
