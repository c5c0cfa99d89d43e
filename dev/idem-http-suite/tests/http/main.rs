//! Every adapter over real HTTP: its app on 127.0.0.1, a real client, and
//! every store `idem_http_suite::backends` lists.

mod callers;
mod cases;
mod cross;
mod faults;
mod knobs;
mod streams;
mod waiting;
