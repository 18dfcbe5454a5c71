//! Test support shared by the integration tests (`tests/it`) and the soak bench
//! (`benches/soak.rs`): real `lull` processes, a webhook collector, the database
//! checker and the multi-process stress harness.

#![allow(dead_code)]

pub mod db;
pub mod discord_fake;
pub mod llama;
pub mod openai_fake;
pub mod postgres;
pub mod process;
pub mod stress;
pub mod telegram_fake;
pub mod webhook;
