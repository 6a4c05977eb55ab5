//! The client's administration: lengths and schema, the cluster's status and map, moves,
//! scrubs, node replacements, and named datasets.

use super::*;

impl AsyncClient {
    /// Length and fields.
    pub async fn info(&self) -> Result<(u64, Vec<FieldInfo>), Error> {
        match self.call(&ClientRequest::Info, Vec::new()).await?.0 {
            Reply::Info { len, fields, .. } => Ok((len, fields)),
            other => Err(unexpected("info", &other)),
        }
    }

    /// Number of records.
    pub async fn len(&self) -> Result<u64, Error> {
        Ok(self.info().await?.0)
    }

    /// True if the cluster holds no records.
    pub async fn is_empty(&self) -> Result<bool, Error> {
        Ok(self.len().await? == 0)
    }

    /// The cluster as the router sees it: id, map version, committed length, every node.
    pub async fn status(&self) -> Result<wire::ClusterStatus, Error> {
        match self.call(&ClientRequest::Status, Vec::new()).await?.0 {
            Reply::Status(status) => Ok(status),
            other => Err(unexpected("status", &other)),
        }
    }

    /// The cluster map placing this handle's dataset, as the router places by it now.
    pub async fn map(&self) -> Result<zr_proto::placement::ClusterMap, Error> {
        let request = ClientRequest::Topology { covering: 0 };
        match self.call(&request, Vec::new()).await?.0 {
            Reply::Topology(topology) => Ok(topology.map),
            other => Err(unexpected("topology", &other)),
        }
    }

    /// Serves shard `shard`'s replica `replica` from the (new, empty) node at `addr` from
    /// now on: the router records the move, then rebuilds the node from an in-sync partner
    /// before it serves. Returns the cluster's status once the move is recorded; the rebuild
    /// shows in later ones (`NodeStatus::rebuild`, then `in_sync`).
    pub async fn replace_node(
        &self,
        shard: u32,
        replica: u32,
        addr: SocketAddr,
    ) -> Result<wire::ClusterStatus, Error> {
        let request = ClientRequest::ReplaceNode {
            shard,
            replica,
            addr: addr.to_string(),
        };
        match self.call(&request, Vec::new()).await?.0 {
            Reply::Status(status) => Ok(status),
            other => Err(unexpected("replace-node", &other)),
        }
    }

    /// Starts moving the cluster to the map with `change` (or goes on with that move, if it
    /// stopped); returns at once. `nodes`: (shard, replica, address) of nodes the router may
    /// not know yet — a new shard's, from the operator's nodes.toml. See
    /// [`Self::move_progress`]. Files are copied at the router's default rate.
    pub async fn move_shards(
        &self,
        change: wire::MapChange,
        nodes: Vec<(u32, u32, SocketAddr)>,
    ) -> Result<Option<wire::MoveReport>, Error> {
        self.move_shards_at(change, nodes, None).await
    }

    /// [`Self::move_shards`], with each node gaining slots copying their files at most
    /// `rate` bytes a second (`Some(0)`: as fast as it can; `None`: the router's default,
    /// [`wire::MOVE_RATE_DEFAULT`]).
    pub async fn move_shards_at(
        &self,
        change: wire::MapChange,
        nodes: Vec<(u32, u32, SocketAddr)>,
        rate: Option<u64>,
    ) -> Result<Option<wire::MoveReport>, Error> {
        let nodes = nodes
            .into_iter()
            .map(|(shard, replica, addr)| (shard, replica, addr.to_string()))
            .collect();
        let request = ClientRequest::MoveShards {
            change,
            nodes,
            rate,
        };
        match self.call(&request, Vec::new()).await?.0 {
            Reply::Moving(report) => Ok(report),
            other => Err(unexpected("move-shards", &other)),
        }
    }

    /// The move the router runs, or ran last: its progress, or how it ended.
    pub async fn move_progress(&self) -> Result<Option<wire::MoveReport>, Error> {
        match self.call(&ClientRequest::MoveProgress, Vec::new()).await?.0 {
            Reply::Moving(report) => Ok(report),
            other => Err(unexpected("move-progress", &other)),
        }
    }

    /// Refuses the certificates issued under `name` (`zr cluster issue --name`) on every
    /// router and node from now on — within a few seconds on those that are up, from their
    /// start on the others — or, with `undo`, serves them again; returns the names refused
    /// after the change. Operators only; a request cannot revoke its own certificate, nor
    /// the cluster's own operator, router or node certificates.
    pub async fn revoke(&self, name: &str, undo: bool) -> Result<Vec<String>, Error> {
        let request = ClientRequest::Revoke {
            name: name.to_string(),
            undo,
        };
        match self.call(&request, Vec::new()).await?.0 {
            Reply::Revoked { names } => Ok(names),
            other => Err(unexpected("revoke", &other)),
        }
    }

    /// Refuses the one certificate of serial number `serial` (hex, as `zr cluster issue`
    /// prints it; colons allowed) on every router and node within seconds (`undo`: serves it
    /// again); returns the serial numbers refused after it. Only certificates `zr cluster
    /// issue` made are refused by serial. Operators only.
    pub async fn revoke_serial(&self, serial: &str, undo: bool) -> Result<Vec<String>, Error> {
        let request = ClientRequest::RevokeSerial {
            serial: serial.to_string(),
            undo,
        };
        match self.call(&request, Vec::new()).await?.0 {
            Reply::Revoked { names } => Ok(names),
            other => Err(unexpected("revoke-serial", &other)),
        }
    }

    /// Adds `grant` (`undo`: takes it out): once a cluster has grants, readers and writers
    /// reach only the datasets grants of their certificate's name cover, through routers
    /// and one hop (see `zr_meta::access`). A pattern without `*` must name a dataset the
    /// cluster has, unless `create_later`. Returns every grant after the change. Operators
    /// only.
    pub async fn grant(
        &self,
        grant: wire::Grant,
        undo: bool,
        create_later: bool,
    ) -> Result<Vec<wire::Grant>, Error> {
        let request = ClientRequest::Grant {
            grant,
            undo,
            create_later,
        };
        match self.call(&request, Vec::new()).await?.0 {
            Reply::Grants { grants } => Ok(grants),
            other => Err(unexpected("grant", &other)),
        }
    }

    /// Every grant (operators only).
    pub async fn grants(&self) -> Result<Vec<wire::Grant>, Error> {
        match self.call(&ClientRequest::Grants, Vec::new()).await?.0 {
            Reply::Grants { grants } => Ok(grants),
            other => Err(unexpected("grants", &other)),
        }
    }

    /// Scrubs records `start..start + count` of shard `shard` (shard-local indices): each
    /// read on every in-sync replica against its CRC, the copies compared, and what fails or
    /// differs repaired from a good copy.
    pub async fn scrub(
        &self,
        shard: u32,
        start: u64,
        count: u64,
    ) -> Result<wire::ScrubReport, Error> {
        let request = ClientRequest::Scrub {
            shard,
            start,
            count,
        };
        match self.call(&request, Vec::new()).await?.0 {
            Reply::Scrubbed(report) => Ok(report),
            other => Err(unexpected("scrub", &other)),
        }
    }

    /// The cluster's datasets: name, records, committed, fields, bytes.
    pub async fn datasets(&self) -> Result<Vec<wire::DatasetInfo>, Error> {
        match self.call(&ClientRequest::Datasets, Vec::new()).await?.0 {
            Reply::Datasets(all) => Ok(all),
            other => Err(unexpected("datasets", &other)),
        }
    }

    /// Creates dataset `name` with `fields` (operator role); returns a handle on it.
    pub async fn create_dataset(
        &self,
        name: &str,
        fields: Vec<FieldInfo>,
    ) -> Result<AsyncClient, Error> {
        self.create_dataset_with_dicts(name, fields, Vec::new())
            .await
    }

    /// Creates dataset `name` with `fields`, zstd fields among them compressed with the
    /// dictionaries `dicts` (e.g. trained by `zr_node::dict::train` on a sample of the
    /// records to come); returns a handle on it. The cluster keeps each dictionary in its
    /// metadata store and gives it to every node holding the dataset, now or later.
    pub async fn create_dataset_with_dicts(
        &self,
        name: &str,
        fields: Vec<FieldInfo>,
        dicts: Vec<FieldDict>,
    ) -> Result<AsyncClient, Error> {
        self.addressing(name)
            .call(&ClientRequest::CreateDataset { fields, dicts }, Vec::new())
            .await?;
        self.dataset(name).await
    }

    /// Drops dataset `name` and every record in it (operator role).
    pub async fn drop_dataset(&self, name: &str) -> Result<(), Error> {
        self.addressing(name)
            .call(&ClientRequest::DropDataset, Vec::new())
            .await
            .map(|_| ())
    }

    /// Adds `field` to this handle's dataset (operator role): the records stored so far
    /// lack it until written ([`Self::write_field`]). The handle knows it from then on.
    pub async fn add_field(&mut self, field: FieldInfo) -> Result<(), Error> {
        self.call(
            &ClientRequest::AddField {
                field: field.clone(),
            },
            Vec::new(),
        )
        .await?;
        self.fields.push(field);
        Ok(())
    }
}
