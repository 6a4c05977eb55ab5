//! The cluster through the simulator, one test binary for all that share a process without
//! harm (linking one binary instead of eleven saves minutes and gigabytes of a clean build).
//! Tests that read the process's own counters keep a binary each: `move_bytes`, `ship` and
//! `ship_routers`.

mod cluster;
mod datasets;
mod direct;
mod failures;
mod faults;
mod metadata;
mod moves;
mod replicas;
mod streams;
mod trust;
mod virtual_time;
