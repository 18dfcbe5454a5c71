//! The contract, one file per area, each with its row types and its trait; the
//! backends implement each area in a file of the same name (`sqlite/<area>.rs`,
//! `postgres/<area>.rs`) and the conformance suite checks it in one too.

pub mod actions;
pub mod leases;
pub mod limits;
pub mod messages;
pub mod outbox;
pub mod overheard;
pub mod reactions;
pub mod rhythm;
pub mod rounds;
pub mod settings;
pub mod status;
pub mod threads;
pub mod work;
