//! haltsql: the policy loader, the verify engine and the HTTP server.
