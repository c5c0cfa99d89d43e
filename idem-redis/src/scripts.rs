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
    pub(crate) reset: Script,
}

impl Scripts {
    /// All of them, to load into a server up front.
    pub(crate) fn all(&self) -> [&Script; 4] {
        [&self.swap, &self.take_over, &self.remove, &self.reset]
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
    reset: compare_and_set!("reset.lua"),
});

#[cfg(test)]
mod tests {
    use crate::record::{self, HEAD, HEAD_SCHEMED, LEASE_OFFSET, TOKEN};

    /// The scripts read records at fixed offsets, all named in one line of
    /// `record.lua`; it must say what `record.rs` writes, or a script would
    /// compare the wrong bytes and refuse (or worse, accept) a record.
    #[test]
    fn the_scripts_layout_is_the_records_layout() {
        let line = format!(
            "local HEAD_V1, HEAD_V2, TOKEN_FIRST, TOKEN_LAST, LEASE_LEN = {}, {}, {}, {}, {}",
            HEAD,
            HEAD_SCHEMED,
            TOKEN.start + 1,
            TOKEN.end,
            LEASE_OFFSET
        );
        let lua = include_str!("lua/record.lua");
        assert!(
            lua.lines().any(|l| l == line),
            "lua/record.lua must hold the line\n{line}"
        );
        assert!(lua.contains(&format!(
            "if version == {} then\n  head = HEAD_V1",
            record::VERSION
        )));
        assert!(lua.contains(&format!(
            "elseif version == {} then\n  head = HEAD_V2",
            record::VERSION_SCHEMED
        )));
        // No script names a byte offset of its own.
        for (name, script) in [
            ("swap.lua", include_str!("lua/swap.lua")),
            ("take_over.lua", include_str!("lua/take_over.lua")),
            ("remove.lua", include_str!("lua/remove.lua")),
            ("reset.lua", include_str!("lua/reset.lua")),
        ] {
            let code: String = script
                .lines()
                .filter(|l| !l.trim_start().starts_with("--"))
                .collect();
            assert!(
                !code.contains(", 3, 18") && !code.contains("v, 51") && !code.contains("v, 50"),
                "{name} hard-codes a record offset"
            );
        }
    }
}
