//! What the `haltsql-operator` process is around the controllers: its flags,
//! HTTP endpoints (metrics, probes), leader election, logging, and the
//! offline `render` subcommand. Depends on [`crate::controllers`], never the
//! other way round.
pub mod api_client;
pub mod cli;
pub mod http;
pub mod leader;
pub mod render_command;
pub mod telemetry;
