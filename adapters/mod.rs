//! Platform adapters. Each translates between one platform and the core's contract
//! ([`crate::platform`]): inbound updates become [`crate::platform::Incoming`] for
//! [`crate::dispatcher::Dispatcher::ingest`], and deliveries arrive through
//! [`crate::platform::Outbound`]. Adapters hold no conversation logic; dependencies
//! point from here to the core, never back.

pub mod console;
pub mod discord;
pub mod http;
pub mod telegram;
