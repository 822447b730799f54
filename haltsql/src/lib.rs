//! haltsql: the policy loader, the verify engine and the HTTP server.
//!
//! [`load`] is the document loader shared by `haltsql validate` and
//! `haltsql serve`; [`cli`] holds the command line.

pub mod audit;
pub mod bundle;
pub mod check;
pub mod cli;
pub mod engine;
pub mod load;
pub mod serve;
