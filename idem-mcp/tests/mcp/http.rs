//! Streamable HTTP on loopback.
