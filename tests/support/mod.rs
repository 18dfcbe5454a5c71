//! Test support shared by the integration tests (`tests/it`) and the benches: real
//! `lull` processes, the loopback fakes of every service lull talks to (`fakes`), the
//! database checker, the multi-process stress harness, and a TCP proxy that can go silent in
//! front of the database (`freeze_proxy`), the wall clock as jobs read it (`wall`), and
//! processes behind the http adapter with their model and webhook (`http_bot`).

#![allow(dead_code)]

pub(crate) mod db;
pub(crate) mod fakes;
pub(crate) mod freeze_proxy;
pub(crate) mod http_bot;
pub(crate) mod llama;
pub(crate) mod postgres;
pub(crate) mod process;
pub(crate) mod skip;
pub(crate) mod stress;
pub(crate) mod trace;
pub(crate) mod wall;
