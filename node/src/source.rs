//! The store as a loader source: gathers materialized into reused columns.

use zr_common::{BoxError, Contiguous, GatherSource};

use crate::store::Store;

impl GatherSource for Store {
    fn gather_into(
        &self,
        indices: &[u64],
        fields: &[String],
        columns: &mut Vec<Contiguous>,
    ) -> Result<(), BoxError> {
        let names: Vec<&str> = fields.iter().map(String::as_str).collect();
        let batch = self.gather(indices, &names)?;
        let mut count = 0;
        for (k, field) in batch.fields().enumerate() {
            if columns.len() <= k {
                columns.push(Contiguous::default());
            }
            let column = &mut columns[k];
            field.write_contiguous(&mut column.data, &mut column.offsets);
            count += 1;
        }
        columns.truncate(count);
        Ok(())
    }
}
