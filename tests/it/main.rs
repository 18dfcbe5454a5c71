//! lull's integration tests: one test binary (faster to build and link), one module
//! per area, shared scaffolding in `helpers`.

#[path = "../support/mod.rs"]
mod support;

mod backup;
mod buttons;
mod chat;
mod check;
mod console;
mod controls;
mod conversations;
mod debounce;
mod discord;
mod dispatcher;
mod docs;
mod drafts;
mod edits;
mod faults;
mod group_context;
mod grouped_ingest;
mod health;
mod helpers;
mod http_api;
mod ingest;
mod ingest_as_sets;
mod jobs;
mod last_step;
mod limits;
mod llm;
mod mcp;
mod media;
mod memory;
mod menus;
mod money;
mod overtaken;
mod project;
mod promql;
mod quirks;
mod reactions;
mod real_models;
mod shutdown;
mod slash;
mod status_page;
mod store;
mod stress;
mod summaries;
mod telegram;
mod telegram_webhook;
mod threads;
mod tool_stress;
mod tools;
mod warm_connections;
mod web;
mod webhook;
