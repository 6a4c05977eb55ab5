//! The `zr` command as a user runs it: one test binary.

mod audit;
mod common;
mod convert_cluster;
mod dataset;
mod sample;
