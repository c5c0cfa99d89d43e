//! The store's Lua scripts: the compare-and-set transitions, each on
//! exactly one key.

use std::sync::LazyLock;

use crate::connection::Script;

/// Every script the store runs.
#[derive(Debug)]
pub(crate) struct Scripts {
    pub(crate) claim: Script,
    pub(crate) load: Script,
    pub(crate) swap: Script,
    pub(crate) take_over: Script,
    pub(crate) remove: Script,
    pub(crate) reset: Script,
    pub(crate) purge: Script,
}

impl Scripts {
    /// All of them, to load into a server up front.
    pub(crate) fn all(&self) -> [&Script; 7] {
        [
            &self.claim,
            &self.load,
            &self.swap,
            &self.take_over,
            &self.remove,
            &self.reset,
            &self.purge,
        ]
    }
}

/// A script that reads the record first (`lua/record.lua`), then does its
/// own steps; one that writes a record has `lua/put.lua` in between.
macro_rules! on_record {
    ($file:literal) => {
        Script::new(concat!(
            include_str!("lua/record.lua"),
            include_str!(concat!("lua/", $file))
        ))
    };
    (writing $file:literal) => {
        Script::new(concat!(
            include_str!("lua/record.lua"),
            include_str!("lua/put.lua"),
            include_str!(concat!("lua/", $file))
        ))
    };
}

/// Built once per process: hashing them is the only cost.
pub(crate) static SCRIPTS: LazyLock<Scripts> = LazyLock::new(|| Scripts {
    claim: on_record!(writing "claim.lua"),
    load: on_record!("load.lua"),
    swap: on_record!(writing "swap.lua"),
    take_over: on_record!(writing "take_over.lua"),
    remove: on_record!("remove.lua"),
    reset: on_record!("reset.lua"),
    purge: on_record!("purge.lua"),
});

#[cfg(test)]
mod tests {
    use crate::record::{self, DEADLINE, HEAD, HEAD_SCHEMED, LEASE_OFFSET, TOKEN};

    /// The scripts read records at fixed offsets, all named in one line of
    /// `record.lua`; it must say what `record.rs` writes, or a script would
    /// compare the wrong bytes and refuse (or worse, accept) a record.
    #[test]
    fn the_scripts_layout_is_the_records_layout() {
        let line = format!(
            "local HEAD_V1, HEAD_V2, TOKEN_FIRST, TOKEN_LAST, DEADLINE_LEN, OFFSET_LEN = {}, {}, {}, {}, {}, {}",
            HEAD,
            HEAD_SCHEMED,
            TOKEN.start + 1,
            TOKEN.end,
            DEADLINE,
            LEASE_OFFSET
        );
        let lua = include_str!("lua/record.lua");
        assert!(
            lua.lines().any(|l| l == line),
            "lua/record.lua must hold the line\n{line}"
        );
        assert!(lua.contains(&format!(
            "if version == {} or version == {} then\n    head = HEAD_V1",
            record::VERSION,
            record::VERSION_EXPIRING
        )));
        assert!(lua.contains(&format!(
            "elseif version == {} or version == {} then\n    head = HEAD_V2",
            record::VERSION_SCHEMED,
            record::VERSION_EXPIRING_SCHEMED
        )));
        assert!(lua.contains(&format!(
            "stamped = version == {} or version == {}",
            record::VERSION,
            record::VERSION_SCHEMED
        )));
        assert!(include_str!("lua/put.lua").contains(&format!(
            "if string.byte(new, 1) == {} then",
            record::VERSION_SCHEMED
        )));
        // No script names a byte offset or a width of its own.
        for (name, script) in [
            ("put.lua", include_str!("lua/put.lua")),
            ("claim.lua", include_str!("lua/claim.lua")),
            ("load.lua", include_str!("lua/load.lua")),
            ("swap.lua", include_str!("lua/swap.lua")),
            ("take_over.lua", include_str!("lua/take_over.lua")),
            ("remove.lua", include_str!("lua/remove.lua")),
            ("reset.lua", include_str!("lua/reset.lua")),
            ("purge.lua", include_str!("lua/purge.lua")),
        ] {
            let code: String = script
                .lines()
                .filter(|l| !l.trim_start().starts_with("--"))
                .collect();
            assert!(
                !code.contains(", 3, 18") && !code.contains("v, 51") && !code.contains("v, 50"),
                "{name} hard-codes a record offset"
            );
            assert!(
                !code.contains("+ 6") && !code.contains("+ 8"),
                "{name} hard-codes a deadline's width"
            );
        }
    }
}
