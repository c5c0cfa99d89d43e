//! The proxy over real sockets in front of upstreams written in Python:
//! its own behaviour (upstream failures, routes, scope, h2c, shutdown,
//! admin), a stampede of duplicates, and the binary killed under load.

mod crash;
mod stampede;
mod support;
mod upstream;
