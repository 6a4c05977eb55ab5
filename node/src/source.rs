//! The store as a loader source: gathers materialized into columns.

use zr_common::{BoxError, Contiguous, GatherSource};

use crate::store::Store;

impl GatherSource for Store {
    fn gather_columns(
        &self,
        indices: &[u64],
        fields: &[String],
    ) -> Result<Vec<Contiguous>, BoxError> {
        let names: Vec<&str> = fields.iter().map(String::as_str).collect();
        let batch = self.gather(indices, &names)?;
        Ok(batch.fields().map(|field| field.to_contiguous()).collect())
    }
}
