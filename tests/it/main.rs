//! lull's integration tests: one test binary (faster to build and link), one module
//! per area, shared scaffolding in `helpers`.

#[path = "../support/mod.rs"]
mod support;

mod chat;
mod check;
mod discord;
mod dispatcher;
mod helpers;
mod http_api;
mod ingest;
mod llm;
mod shutdown;
mod stress;
mod telegram;
mod webhook;
