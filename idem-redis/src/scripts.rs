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

/// Built once per process: hashing them is the only cost.
pub(crate) static SCRIPTS: LazyLock<Scripts> = LazyLock::new(|| Scripts {
    swap: Script::new(include_str!("lua/swap.lua")),
    take_over: Script::new(include_str!("lua/take_over.lua")),
    remove: Script::new(include_str!("lua/remove.lua")),
});
