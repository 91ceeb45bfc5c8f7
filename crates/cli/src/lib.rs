//! The library side of the `trigger-bridge` binary: the config file's parser and validation
//! ([`config`], with the listen-address and database-URL rules it uses), so the fuzz targets
//! (`fuzz/`) and tests can reach them. Everything else lives in the binary (`main.rs`).

pub mod config;
pub mod db_url;
pub mod listen;
