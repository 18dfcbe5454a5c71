//! Test support shared by the integration tests (`tests/it`) and the benches: real
//! `lull` processes, the loopback fakes of every service lull talks to (`fakes`), the
//! database checker, the multi-process stress harness, and a TCP proxy that can go silent in
//! front of the database (`freeze_proxy`).

#![allow(dead_code)]

pub mod db;
pub mod fakes;
pub mod freeze_proxy;
pub mod llama;
pub mod postgres;
pub mod process;
pub mod skip;
pub mod stress;
pub mod trace;
