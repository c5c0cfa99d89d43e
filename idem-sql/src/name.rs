//! Table names: checked once, then the only text ever spliced into SQL.

use std::fmt;
use std::marker::PhantomData;

use idem_core::store::StoreError;

/// How one database names and quotes tables.
pub trait Dialect {
    /// The backend's name in errors (`postgres`, `mysql`).
    const BACKEND: &'static str;
    /// The quote around each part of a name in SQL: `"` or `` ` ``.
    const QUOTE: char;
    /// What the part before the `.` is called: `schema` or `database`.
    const QUALIFIER: &'static str;
    /// The longest qualifier part accepted.
    const MAX_QUALIFIER: usize;
    /// The longest table part accepted.
    const MAX_TABLE: usize;
    /// The table used when none is named.
    const DEFAULT_TABLE: &'static str;
}

/// A validated, optionally qualified table name: `table` or
/// `qualifier.table`, each part a plain identifier.
pub struct TableName<D> {
    qualifier: Option<String>,
    table: String,
    dialect: PhantomData<fn() -> D>,
}

impl<D: Dialect> TableName<D> {
    /// Accepts `table` or `qualifier.table`, each part an ASCII letter or
    /// `_`, then ASCII letters, digits or `_`, within the dialect's lengths.
    /// Anything else (quotes, spaces, semicolons, an empty part, a third
    /// part) is a configuration error, so no input can change the meaning
    /// of a statement the name is spliced into.
    pub fn parse(name: &str) -> Result<TableName<D>, StoreError> {
        let refuse = |why: &str| {
            StoreError::config(
                D::BACKEND,
                format!(
                    "invalid table name {name:?}: {why}; expected `table` or `{}.table` made of ASCII letters, digits and `_`",
                    D::QUALIFIER
                ),
            )
        };
        let mut parts = name.split('.');
        let (qualifier, table) = match (parts.next(), parts.next(), parts.next()) {
            (Some(table), None, None) => (None, table),
            (Some(qualifier), Some(table), None) => (Some(qualifier), table),
            _ => return Err(refuse("more than one `.`")),
        };
        if let Some(qualifier) = qualifier {
            identifier(qualifier, D::MAX_QUALIFIER).map_err(|why| refuse(&why))?;
        }
        identifier(table, D::MAX_TABLE).map_err(|why| refuse(&why))?;
        Ok(TableName {
            qualifier: qualifier.map(str::to_owned),
            table: table.to_owned(),
            dialect: PhantomData,
        })
    }

    /// The name as the caller wrote it.
    pub fn display(&self) -> String {
        match &self.qualifier {
            Some(qualifier) => format!("{qualifier}.{}", self.table),
            None => self.table.clone(),
        }
    }

    /// The table part, unquoted.
    pub fn table(&self) -> &str {
        &self.table
    }

    /// The qualifier part (schema or database), unquoted, if any.
    pub fn qualifier(&self) -> Option<&str> {
        self.qualifier.as_deref()
    }

    /// The quoted, qualified name to splice into SQL. Quoting keeps the
    /// name exactly as given (case included) and lets reserved words such as
    /// `order` be table names; validation already ruled out quotes inside.
    pub fn quoted(&self) -> String {
        let q = D::QUOTE;
        match &self.qualifier {
            Some(qualifier) => format!("{q}{qualifier}{q}.{q}{}{q}", self.table),
            None => format!("{q}{}{q}", self.table),
        }
    }
}

impl<D: Dialect> Default for TableName<D> {
    /// The dialect's default table, unqualified.
    fn default() -> TableName<D> {
        TableName {
            qualifier: None,
            table: D::DEFAULT_TABLE.to_owned(),
            dialect: PhantomData,
        }
    }
}

impl<D> Clone for TableName<D> {
    fn clone(&self) -> TableName<D> {
        TableName {
            qualifier: self.qualifier.clone(),
            table: self.table.clone(),
            dialect: PhantomData,
        }
    }
}

impl<D> PartialEq for TableName<D> {
    fn eq(&self, other: &TableName<D>) -> bool {
        self.qualifier == other.qualifier && self.table == other.table
    }
}

impl<D> Eq for TableName<D> {}

impl<D> fmt::Debug for TableName<D> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TableName")
            .field("qualifier", &self.qualifier)
            .field("table", &self.table)
            .finish()
    }
}

/// Checks one part of a name: an ASCII letter or `_`, then ASCII letters,
/// digits or `_`, at most `max` characters. The error says why not.
pub fn identifier(part: &str, max: usize) -> Result<(), String> {
    let mut chars = part.chars();
    match chars.next() {
        None => return Err("a part is empty".to_owned()),
        Some(c) if !(c.is_ascii_alphabetic() || c == '_') => {
            return Err(format!("{part:?} must start with an ASCII letter or `_`"))
        }
        Some(_) => {}
    }
    if let Some(c) = chars.find(|c| !(c.is_ascii_alphanumeric() || *c == '_')) {
        return Err(format!("{part:?} contains {c:?}"));
    }
    if part.len() > max {
        return Err(format!("{part:?} is longer than {max} characters"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use idem_core::store::StoreErrorKind;

    use super::*;

    #[derive(Debug)]
    struct Backticks;

    impl Dialect for Backticks {
        const BACKEND: &'static str = "test";
        const QUOTE: char = '`';
        const QUALIFIER: &'static str = "database";
        const MAX_QUALIFIER: usize = 10;
        const MAX_TABLE: usize = 5;
        const DEFAULT_TABLE: &'static str = "dflt";
    }

    type Name = TableName<Backticks>;

    #[test]
    fn parts_are_kept_quoted_and_shown_as_written() {
        let name = Name::parse("Db_1.order").unwrap();
        assert_eq!(name.quoted(), "`Db_1`.`order`");
        assert_eq!(name.display(), "Db_1.order");
        assert_eq!((name.qualifier(), name.table()), (Some("Db_1"), "order"));
        assert_eq!(Name::parse("dflt").unwrap(), Name::default());
        assert_eq!(Name::default().quoted(), "`dflt`");
    }

    #[test]
    fn every_other_name_is_a_config_error_naming_the_qualifier() {
        for name in [
            "",
            ".",
            "a.",
            ".a",
            "a.b.c",
            "x;y",
            "`q`",
            "\"q\"",
            "it's",
            "1a",
            "a b",
            "ü",
            "a-b",
            "sixsix",
            "elevenchars.t",
        ] {
            let error = Name::parse(name).unwrap_err();
            assert_eq!(error.kind(), StoreErrorKind::Config, "{name:?}");
            let text = error.to_string();
            assert!(text.contains("invalid table name"), "{text}");
            assert!(text.contains("`database.table`"), "{text}");
        }
        assert!(Name::parse("fivec").is_ok());
        assert!(Name::parse("tenchars_x.t").is_ok());
        assert!(Name::parse("ninechars.t").is_ok());
    }

    #[test]
    fn identifiers_say_why_they_are_refused() {
        assert_eq!(identifier("_a1", 3), Ok(()));
        assert!(identifier("9a", 3).unwrap_err().contains("must start"));
        assert!(identifier("a$", 3).unwrap_err().contains("'$'"));
        assert!(identifier("abcd", 3).unwrap_err().contains("longer than 3"));
    }
}
