//! Memory (`LULL_MEMORY`): facts the model is asked to remember, kept as rows and
//! shown in the system prompt within `LULL_MEMORY_CHARS`.

use clap::Args;
use lull_core::dispatcher::{MEMORY_CHARS, MemorySettings};

use super::ConfigError;

/// `LULL_MEMORY`, `LULL_MEMORY_CHARS`.
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Memory")]
pub(crate) struct MemoryArgs {
    /// `on`: the model may remember facts (`lull__remember`, `lull__forget`, with LULL_TOOLS=auto), they are shown in its system prompt, and `/memory` lists them; `off`: nothing is shown or offered, and `/memory` says memory is off (`/forgetme` still erases).
    #[arg(long, global = true, env = "LULL_MEMORY", default_value = "on")]
    pub memory: String,
    /// The most characters of memories in one prompt: the newest that fit whole.
    #[arg(long, global = true, env = "LULL_MEMORY_CHARS", default_value_t = MEMORY_CHARS)]
    pub memory_chars: usize,
}

/// The smallest `LULL_MEMORY_CHARS`: room for a memory of a few words.
const MIN_MEMORY_CHARS: usize = 50;

impl MemoryArgs {
    /// The memory settings; `None` with `LULL_MEMORY=off`.
    pub(crate) fn settings(&self) -> Result<Option<MemorySettings>, ConfigError> {
        if !super::on_off("LULL_MEMORY", &self.memory)? {
            return Ok(None);
        }
        if self.memory_chars < MIN_MEMORY_CHARS {
            return Err(ConfigError(format!(
                "LULL_MEMORY_CHARS must be at least {MIN_MEMORY_CHARS}, got {} (or set LULL_MEMORY=off)",
                self.memory_chars
            )));
        }
        Ok(Some(MemorySettings {
            chars: self.memory_chars,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::super::Config;
    use super::super::tests::{assert_errors_name, settings};
    use super::*;

    #[test]
    fn memory_is_on_by_default_and_each_setting_is_checked() {
        let memory = |args: &[&str]| {
            Config::from_settings(&settings(args))
                .unwrap()
                .dispatch
                .memory
        };
        assert_eq!(memory(&[]), Some(MemorySettings::default()));
        assert_eq!(memory(&["--memory", "off"]), None);
        assert_eq!(memory(&["--memory-chars", "500"]).unwrap().chars, 500);
        assert_errors_name(&[
            (&["--memory", "maybe"], "LULL_MEMORY"),
            (&["--memory-chars", "10"], "LULL_MEMORY_CHARS"),
        ]);
    }

    #[test]
    fn lulls_own_tools_follow_lull_tools() {
        let builtin = |args: &[&str]| {
            Config::from_settings(&settings(args))
                .unwrap()
                .dispatch
                .builtin_tools
        };
        assert!(builtin(&[]));
        assert!(!builtin(&["--tools", "off"]));
    }
}
