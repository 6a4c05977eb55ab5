//! The datasets a node holds: listed, created, dropped, and a field added to one.

use super::*;

/// The named datasets the node holds, with their fields, lengths and bytes.
pub(crate) fn datasets(ctx: &Ctx<'_>) -> Outcome {
    let held = ctx
        .node()?
        .list()
        .into_iter()
        .map(|held| wire::DatasetInfo {
            name: held.name,
            id: held.id,
            fields: held.fields.iter().map(field_info).collect(),
            len: held.len,
            committed: None,
            bytes: held.bytes,
            commits: None,
        })
        .collect();
    Ok((Reply::Datasets(held), Vec::new()))
}

/// Makes the named dataset addressed, with `fields` and their dictionaries.
pub(crate) fn create_dataset(
    ctx: &Ctx<'_>,
    id: u64,
    fields: Vec<FieldInfo>,
    dicts: Vec<FieldDict>,
) -> Outcome {
    let specs = fields
        .iter()
        .map(field_spec)
        .collect::<Result<Vec<_>, _>>()
        .map_err(Refusal::Store)?;
    let dicts = field_dicts(&fields, dicts)?;
    ctx.node()?
        .create(ctx.named()?, id, specs, &dicts)
        .map_err(Refusal::Store)?;
    Ok((Reply::Done, Vec::new()))
}

/// Removes the named dataset addressed if this node holds it as made at `id` or earlier.
pub(crate) fn drop_dataset(ctx: &Ctx<'_>, id: u64) -> Outcome {
    ctx.node()?
        .drop_dataset(ctx.named()?, id)
        .map_err(Refusal::Store)?;
    Ok((Reply::Done, Vec::new()))
}

/// Adds `field` to every record of the dataset addressed.
pub(crate) fn add_field(ctx: &Ctx<'_>, field: FieldInfo) -> Outcome {
    let Ctx { dataset, .. } = *ctx;
    let spec = field_spec(&field).map_err(Refusal::Store)?;
    ctx.node()?
        .add_field(dataset, spec)
        .map_err(Refusal::Store)?;
    Ok((Reply::Done, Vec::new()))
}
