//! Test support shared by the integration tests (`tests/it`) and the soak bench
//! (`benches/soak.rs`): real `lull` processes, a webhook collector, the database
//! checker, the multi-process stress harness, and a TCP proxy that can go silent in
//! front of the database (`freeze_proxy`).

#![allow(dead_code)]

pub mod db;
pub mod discord_fake;
pub mod freeze_proxy;
pub mod llama;
pub mod openai_fake;
pub mod postgres;
pub mod process;
pub mod stress;
pub mod telegram_fake;
pub mod webhook;
