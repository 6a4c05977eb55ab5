//! A record to write: field name → payload, borrowed. Shared by the store and the cluster
//! client so both take the same input.

/// One record to append or to write over an existing one. Fields it does not name are absent
/// (stored as a zero entry); an empty payload is absent too.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Record<'a> {
    values: Vec<(&'a str, &'a [u8])>,
}

impl<'a> Record<'a> {
    /// A record with no fields yet.
    pub fn new() -> Record<'a> {
        Record { values: Vec::new() }
    }

    /// Sets `field` to `payload`.
    pub fn with(mut self, field: &'a str, payload: &'a [u8]) -> Record<'a> {
        self.values.push((field, payload));
        self
    }

    /// Sets `field` to `payload`.
    pub fn set(&mut self, field: &'a str, payload: &'a [u8]) {
        self.values.push((field, payload));
    }

    /// The (field, payload) pairs in the order they were set.
    pub fn values(&self) -> &[(&'a str, &'a [u8])] {
        &self.values
    }

    /// The payload of `field`, if set.
    pub fn get(&self, field: &str) -> Option<&'a [u8]> {
        self.values
            .iter()
            .find(|(name, _)| *name == field)
            .map(|(_, payload)| *payload)
    }
}
