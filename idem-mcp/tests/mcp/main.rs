//! `idem-mcp` with a real rmcp client and server: over in-process pipes
//! (the stdio transport's byte stream) through a proxy that drops
//! responses, and over Streamable HTTP on loopback.

mod http;
mod pipes;
mod support;
