//! The networking crate's errors. Each names the peer or address it concerns, and a caller
//! can tell a timeout, a refused certificate and a broken connection apart without reading
//! the message.

use std::net::SocketAddr;

/// Errors of endpoints, connections and calls.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A message broke the protocol or came from another version, or the peer answered
    /// with an error.
    #[error(transparent)]
    Proto(#[from] zr_proto::Error),
    /// A configuration or certificate file that cannot be used.
    #[error("{path}: {reason}")]
    Config { path: String, reason: String },
    /// TLS or QUIC could not be set up with the credentials given.
    #[error("{0}")]
    Setup(String),
    /// No endpoint could be opened on `addr`.
    #[error("cannot start an endpoint on {addr}: {reason}")]
    Endpoint { addr: SocketAddr, reason: String },
    /// Nothing answered a connection attempt in time.
    #[error(
        "no answer from {peer} within {waited_ms} ms (wrong address, or nothing listening there?)"
    )]
    NoAnswer { peer: SocketAddr, waited_ms: u128 },
    /// The peer did not reply to a request in time.
    #[error("{peer}: no reply within {waited_ms} ms")]
    NoReply { peer: SocketAddr, waited_ms: u128 },
    /// The TLS handshake failed: one side refused the other's certificate.
    #[error("cannot connect to {peer}: {reason}")]
    NotAuthorised { peer: SocketAddr, reason: String },
    /// The connection could not be made, or broke during an exchange.
    #[error("{peer}: {reason}")]
    Link { peer: SocketAddr, reason: String },
}

impl Error {
    /// True for a peer that did not answer in time.
    pub fn is_timeout(&self) -> bool {
        matches!(self, Error::NoAnswer { .. } | Error::NoReply { .. })
    }
}
