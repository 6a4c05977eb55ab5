//! The engine's tests, one binary (linking one instead of eight saves minutes and gigabytes
//! of a clean build). The crash and power-cut campaigns keep a binary each, so that they can
//! be run alone with a seed (`ops/crash-campaign.sh`).

#[path = "../workload/mod.rs"]
mod workload;

mod basics;
mod cold;
mod concurrency;
mod fields;
mod kit;
mod loader;
mod model;
mod stream;
mod units;
