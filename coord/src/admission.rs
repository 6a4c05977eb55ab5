//! Whether a router carries out a client's request, from what it knows of the sender: a
//! revoked certificate is refused first, then a role below what the request needs, then a
//! reader or writer outside its grants, then an operator revoking the certificate its own
//! request comes with; and which requests the audit log keeps. The router finds the facts
//! (the sender's certificate, the access record) and performs the verdict.

use zr_proto::wire::Access;

/// What the router knows of a request and its sender.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Asked {
    /// What the sender's role may do (`None`: a certificate of no client role).
    pub has: Option<Access>,
    /// What the request needs.
    pub needs: Access,
    /// Why the sender's certificate is refused, if it is revoked.
    pub revoked: Option<String>,
    /// For a request on a dataset's records (`Some(true)`: it writes), whether the grants
    /// allow the sender that dataset; `None` when no grant applies (a request not on
    /// records, a cluster with no grants, or a sender grants do not bind).
    pub granted: Option<bool>,
    /// Whether the request is on records and writes (as for `granted`).
    pub writes: bool,
    /// Whether the request revokes the certificate it comes with.
    pub revokes_itself: bool,
}

/// A verdict on a request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Carry it out.
    Admit,
    /// Its certificate is revoked: why.
    Revoked(String),
    /// Its role may not make it: the role it needs.
    Forbidden { needs: Access },
    /// No grant covers the dataset for it (`write`: it writes).
    NotGranted { write: bool },
    /// It would revoke the certificate it comes with, locking its operator out.
    RevokesItself,
}

/// Whether a sender whose role has `has` is bound by grants, where the cluster has any: a
/// reader or writer is; an operator, and an in-process caller, are not.
pub fn bound_by_grants(has: Option<Access>) -> bool {
    has.is_some_and(|a| a < Access::Operate)
}

impl Verdict {
    /// The verdict on `asked`; see the module documentation for the order.
    pub fn of(asked: &Asked) -> Verdict {
        if let Some(why) = &asked.revoked {
            return Verdict::Revoked(why.clone());
        }
        if asked.has.is_none_or(|has| has < asked.needs) {
            return Verdict::Forbidden { needs: asked.needs };
        }
        if asked.granted == Some(false) {
            return Verdict::NotGranted {
                write: asked.writes,
            };
        }
        if asked.revokes_itself {
            return Verdict::RevokesItself;
        }
        Verdict::Admit
    }

    /// Whether the sender was refused for who it is (revoked, its role, its grants), as the
    /// audit log counts a refusal; a refused self-revocation is an error of the request.
    pub fn refused(&self) -> bool {
        matches!(
            self,
            Verdict::Revoked(_) | Verdict::Forbidden { .. } | Verdict::NotGranted { .. }
        )
    }

    /// What the audit log keeps of a request of kind `kind` needing `needs` with this
    /// verdict, carried out with `ok` (when admitted): every refusal, and the outcome of
    /// every operator request and commit; `None` for the rest.
    pub fn audited(&self, needs: Access, kind: &str, ok: bool) -> Option<&'static str> {
        let outcome = match (self.refused(), ok) {
            (true, _) => return Some("refused"),
            (false, true) => "ok",
            (false, false) => "error",
        };
        (needs == Access::Operate || kind == "commit").then_some(outcome)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn asked(has: Option<Access>, needs: Access) -> Asked {
        Asked {
            has,
            needs,
            revoked: None,
            granted: None,
            writes: false,
            revokes_itself: false,
        }
    }

    #[test]
    fn each_role_makes_the_requests_of_its_access_and_below() {
        let roles = [Access::Read, Access::Write, Access::Operate];
        for has in roles {
            for needs in roles {
                let verdict = Verdict::of(&asked(Some(has), needs));
                if has >= needs {
                    assert_eq!(verdict, Verdict::Admit, "{has:?} asking {needs:?}");
                } else {
                    assert_eq!(
                        verdict,
                        Verdict::Forbidden { needs },
                        "{has:?} asking {needs:?}"
                    );
                    assert!(verdict.refused());
                }
            }
            // A certificate of no client role may do nothing.
            assert_eq!(
                Verdict::of(&asked(None, has)),
                Verdict::Forbidden { needs: has }
            );
        }
    }

    #[test]
    fn a_revocation_comes_first_then_the_role_then_the_grants() {
        let revoked = Asked {
            revoked: Some("revoked by name".into()),
            granted: Some(false),
            ..asked(Some(Access::Read), Access::Operate)
        };
        assert_eq!(
            Verdict::of(&revoked),
            Verdict::Revoked("revoked by name".into())
        );
        let forbidden = Asked {
            granted: Some(false),
            ..asked(Some(Access::Read), Access::Write)
        };
        assert_eq!(
            Verdict::of(&forbidden),
            Verdict::Forbidden {
                needs: Access::Write
            }
        );
        let not_granted = Asked {
            granted: Some(false),
            writes: true,
            ..asked(Some(Access::Write), Access::Write)
        };
        assert_eq!(
            Verdict::of(&not_granted),
            Verdict::NotGranted { write: true }
        );
        let granted = Asked {
            granted: Some(true),
            ..not_granted.clone()
        };
        assert_eq!(Verdict::of(&granted), Verdict::Admit);
    }

    #[test]
    fn grants_bind_readers_and_writers_only() {
        assert!(bound_by_grants(Some(Access::Read)));
        assert!(bound_by_grants(Some(Access::Write)));
        assert!(!bound_by_grants(Some(Access::Operate)));
        assert!(!bound_by_grants(None));
    }

    #[test]
    fn an_operator_cannot_revoke_its_own_certificate() {
        let own = Asked {
            revokes_itself: true,
            ..asked(Some(Access::Operate), Access::Operate)
        };
        let verdict = Verdict::of(&own);
        assert_eq!(verdict, Verdict::RevokesItself);
        assert!(!verdict.refused(), "an error of the request, not a refusal");
        assert_eq!(
            verdict.audited(Access::Operate, "revoke", false),
            Some("error")
        );
    }

    #[test]
    fn refusals_operator_requests_and_commits_are_audited() {
        let admit = Verdict::Admit;
        assert_eq!(admit.audited(Access::Read, "gather", true), None);
        assert_eq!(admit.audited(Access::Write, "append", false), None);
        assert_eq!(admit.audited(Access::Write, "commit", true), Some("ok"));
        assert_eq!(
            admit.audited(Access::Operate, "scrub", false),
            Some("error")
        );
        let refused = Verdict::Forbidden {
            needs: Access::Write,
        };
        assert_eq!(
            refused.audited(Access::Write, "append", false),
            Some("refused")
        );
        let not_granted = Verdict::NotGranted { write: false };
        assert_eq!(
            not_granted.audited(Access::Read, "gather", false),
            Some("refused")
        );
    }
}
