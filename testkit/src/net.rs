//! Loopback ports.

use std::net::TcpListener;

/// A loopback port that was free a moment ago.
pub fn free_port() -> std::io::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}
