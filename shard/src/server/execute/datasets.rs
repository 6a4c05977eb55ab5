//! The datasets a node holds: listed, created, dropped, and a field added to one.

use super::*;

/// `NodeRequest::Datasets`.
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

/// `NodeRequest::CreateDataset`.
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

/// `NodeRequest::DropDataset`.
pub(crate) fn drop_dataset(ctx: &Ctx<'_>, id: u64) -> Outcome {
    ctx.node()?
        .drop_dataset(ctx.named()?, id)
        .map_err(Refusal::Store)?;
    Ok((Reply::Done, Vec::new()))
}

/// `NodeRequest::AddField`.
pub(crate) fn add_field(ctx: &Ctx<'_>, field: FieldInfo) -> Outcome {
    let Ctx { dataset, .. } = *ctx;
    let spec = field_spec(&field).map_err(Refusal::Store)?;
    ctx.node()?
        .add_field(dataset, spec)
        .map_err(Refusal::Store)?;
    Ok((Reply::Done, Vec::new()))
}
