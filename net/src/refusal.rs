//! Connection errors in words a user can act on: a TLS refusal says which side refused
//! what, and what to do about it.

use std::net::SocketAddr;

use quinn::ConnectionError;

use crate::error::Error;
use crate::rpc::PROTOCOL_VIOLATION;

/// The error of a connection to `peer` that failed with `e`: a refused certificate is
/// [`Error::NotAuthorised`].
pub(crate) fn connection_error(peer: SocketAddr, e: &ConnectionError) -> Error {
    let reason = describe(e);
    match e {
        ConnectionError::ConnectionClosed(close) if is_alert(u64::from(close.error_code)) => {
            Error::NotAuthorised { peer, reason }
        }
        ConnectionError::TransportError(t) if is_alert(u64::from(t.code)) => {
            Error::NotAuthorised { peer, reason }
        }
        _ => Error::Link {
            peer,
            reason: format!("cannot connect: {reason}"),
        },
    }
}

/// True for a QUIC transport code that carries a TLS alert (0x100 + alert).
fn is_alert(code: u64) -> bool {
    (0x100..0x200).contains(&code)
}

/// A connection error in words a user can act on: TLS refusals say which side refused what.
pub fn describe(e: &ConnectionError) -> String {
    let (code, reason) = match e {
        ConnectionError::ConnectionClosed(close) => (u64::from(close.error_code), None),
        ConnectionError::TransportError(t) => (u64::from(t.code), Some(t.reason.clone())),
        ConnectionError::ApplicationClosed(close)
            if close.error_code == PROTOCOL_VIOLATION.into() =>
        {
            return "the peer closed the connection: this side broke the protocol".into()
        }
        other => return other.to_string(),
    };
    tls_refusal(code, reason).unwrap_or_else(|| e.to_string())
}

/// A TLS alert (QUIC transport code `code`: 0x100 + alert) in words a user can act on;
/// `None` if `code` is not an alert.
fn tls_refusal(code: u64, reason: Option<String>) -> Option<String> {
    if !is_alert(code) {
        return None;
    }
    let alert = code - 0x100;
    Some(match (alert, reason) {
        (_, Some(reason)) if reason.to_lowercase().contains("expired") => format!(
            "the peer's certificate has expired ({reason}); issue new ones with `zr cluster-renew` and restart the peer (or is a clock wrong?)"
        ),
        (_, Some(reason))
            if reason.contains("UnknownIssuer") || reason.contains("BadSignature") =>
        {
            format!(
                "the peer's certificate is not from this cluster's CA ({reason}); a certificate directory of another cluster, or a peer running --insecure-dev?"
            )
        }
        (_, Some(reason)) if reason.contains("NotValidForName") => format!(
            "the peer's certificate is for another role ({reason}); is the address right?"
        ),
        (_, Some(reason)) if reason.contains("UnknownCA") || reason.contains("BadCertificate") => format!(
            "the peer refused the certificate this side presented ({reason})"
        ),
        (116, _) => "the peer requires a certificate and this side presented none (give it the cluster's certificates, or run both sides with --insecure-dev)".into(),
        (45, _) => "the peer refused the certificate this side presented: it has expired; issue new ones with `zr cluster-renew` and restart this process".into(),
        (42 | 48, _) => "the peer refused the certificate this side presented: it is from another cluster's CA, or for the wrong role".into(),
        (43, _) => "the peer refused the certificate this side presented: it is not for connecting (a node certificate made before nodes connected to nodes: issue new ones with `zr cluster-renew`)".into(),
        (alert, reason) => format!(
            "TLS handshake failed (alert {alert}{})",
            reason.map(|r| format!(": {r}")).unwrap_or_default()
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    /// TLS refusals read as what to do: an expired certificate names `zr cluster-renew` on
    /// the side that found it and on the side whose certificate it was.
    #[test]
    fn expired_certificates_are_named_on_both_sides() {
        let alert = u64::from(quinn::TransportErrorCode::crypto(45));
        let reason = "invalid peer certificate: certificate expired: verification time 2, but certificate is not valid after 1";
        let found = tls_refusal(alert, Some(reason.into())).unwrap_or_default();
        let refused = describe(&ConnectionError::ConnectionClosed(quinn::ConnectionClose {
            error_code: quinn::TransportErrorCode::crypto(45),
            frame_type: None,
            reason: Bytes::new(),
        }));
        for (text, who) in [
            (found, "the peer's certificate"),
            (refused, "this side presented"),
        ] {
            assert!(text.contains(who) && text.contains("expired"), "{text}");
            assert!(text.contains("zr cluster-renew"), "{text}");
        }
    }
}
