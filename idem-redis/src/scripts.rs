//! The store's Lua scripts: the compare-and-set transitions, each on
//! exactly one key.

use std::sync::LazyLock;

use crate::connection::Script;

/// Every script the store runs.
#[derive(Debug)]
pub(crate) struct Scripts {
    pub(crate) swap: Script,
    pub(crate) take_over: Script,
    pub(crate) remove: Script,
}

impl Scripts {
    /// All of them, to load into a server up front.
    pub(crate) fn all(&self) -> [&Script; 3] {
        [&self.swap, &self.take_over, &self.remove]
    }
}

/// A compare-and-set script: the shared record check (`lua/record.lua`),
/// then the script's own steps.
macro_rules! compare_and_set {
    ($file:literal) => {
        Script::new(concat!(
            include_str!("lua/record.lua"),
            include_str!(concat!("lua/", $file))
        ))
    };
}

/// Built once per process: hashing them is the only cost.
pub(crate) static SCRIPTS: LazyLock<Scripts> = LazyLock::new(|| Scripts {
    swap: compare_and_set!("swap.lua"),
    take_over: compare_and_set!("take_over.lua"),
    remove: compare_and_set!("remove.lua"),
});
