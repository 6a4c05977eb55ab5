//! Changing a running cluster: routers added, restarted, stopped or killed; nodes stopped,
//! crashed, stalled, faked, started again or replaced; a shard's nodes added; moves run to
//! their end.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use zr_net::tls::Role;
use zr_net::{self as net, Security};

use super::*;

impl SimCluster {
    /// Starts another router over the same nodes; returns its address.
    pub fn add_router(&mut self) -> Result<SocketAddr, SimError> {
        self.add_router_with(self.config.clone())
    }

    /// Starts another router from `config` (the cluster's, changed as a test needs: a
    /// mistaken nodes.toml, say) over the same metadata store; returns its address.
    pub fn add_router_with(&mut self, config: ClusterConfig) -> Result<SocketAddr, SimError> {
        let metadata = self.metadata()?;
        let security = self.security(Role::Router)?;
        let (addr, running, serving) = self.runtime.block_on(async {
            let endpoint = net::server_endpoint(config.router.listen, &security)?;
            let addr = endpoint.local_addr()?;
            let router: Arc<Router> =
                Router::start_with(&config, security, Arc::clone(&metadata)).await?;
            let (stop, stopped) = oneshot::channel::<()>();
            let serving = Arc::clone(&router);
            let task = tokio::spawn(async move {
                Arc::clone(&router)
                    .serve(endpoint, async {
                        let _ = stopped.await;
                    })
                    .await;
                router.give_back_lease().await;
                Ok(())
            });
            Ok::<_, SimError>((addr, Running { stop, task }, serving))
        })?;
        self.routers.push((addr, running, serving));
        Ok(addr)
    }

    /// Stops the first router and starts a fresh one (a new address); returns it.
    pub fn restart_router(&mut self) -> Result<SocketAddr, SimError> {
        self.stop_router(0)?;
        let addr = self.add_router()?;
        let last = self.routers.len() - 1;
        self.routers.swap(0, last);
        Ok(addr)
    }

    /// Stops router `index` (in the order of [`Self::router_addrs`]) gracefully: requests in
    /// flight finish, and it gives the writer lease back.
    pub fn stop_router(&mut self, index: usize) -> Result<(), SimError> {
        let (_, running, _) = self.routers.remove(index);
        self.finish(running)
    }

    /// Kills router `index` (in the order of [`Self::router_addrs`]) as `kill -9` would:
    /// its requests in flight and its background tasks (a move, catch-ups, the lease's
    /// release) stop wherever they are, and it gives nothing back (the writer lease stays
    /// held until it lapses).
    pub fn kill_router(&mut self, index: usize) {
        let (_, running, router) = self.routers.remove(index);
        router.kill();
        running.task.abort();
        let _ = self.runtime.block_on(running.task);
    }

    /// Stops shard `shard` gracefully: no new requests, requests in flight finish, commit.
    pub fn stop_node(&mut self, shard: u32) -> Result<(), SimError> {
        match self.nodes[shard as usize].take() {
            Some(running) => self.finish(running),
            None => Ok(()),
        }
    }

    /// Crashes shard `shard`: its task is dropped mid-flight, without a commit.
    pub fn crash_node(&mut self, shard: u32) {
        if let Some(running) = self.nodes[shard as usize].take() {
            running.task.abort();
            let _ = self.runtime.block_on(running.task);
        }
    }

    /// Stalls shard `shard`: it stops (gracefully) and its address is taken by a server that
    /// accepts connections and requests but never answers. `start_node` ends the stall.
    pub fn stall_node(&mut self, shard: u32) -> Result<(), SimError> {
        self.fake_node(shard, |_| std::future::pending::<(Vec<u8>, net::Body)>())
    }

    /// Replaces shard `shard` with an impostor: the node stops (gracefully) and its address
    /// is taken by a server with the node's certificate that answers every request with
    /// `handler` (a faulty or hostile node). `start_node` brings the real one back.
    pub fn fake_node<H, F>(&mut self, shard: u32, handler: H) -> Result<(), SimError>
    where
        H: Fn(Vec<u8>) -> F + Clone + Send + Sync + 'static,
        F: std::future::Future<Output = (Vec<u8>, net::Body)> + Send + 'static,
    {
        self.stop_node(shard)?;
        let endpoint = self.bind_node(shard)?;
        let serving = endpoint.clone();
        let task = self.runtime.spawn(async move {
            net::serve(
                &serving,
                net::Limits::new(64, Duration::from_secs(3600)),
                std::future::pending(),
                handler,
            )
            .await;
            Ok(())
        });
        self.impostors[shard as usize] = Some(Impostor { task, endpoint });
        Ok(())
    }

    /// Starts shard `shard` again on its address, from its data directory.
    pub fn start_node(&mut self, shard: u32) -> Result<(), SimError> {
        if let Some(impostor) = self.impostors[shard as usize].take() {
            impostor.stop(&self.runtime);
        }
        if self.nodes[shard as usize].is_some() {
            return Ok(());
        }
        let endpoint = self.bind_node(shard)?;
        let running = self.run_node(shard, endpoint)?;
        self.nodes[shard as usize] = Some(running);
        Ok(())
    }

    /// Replaces node `node` with a new machine, as `zr cluster replace-node` expects it: the
    /// old node is crashed and its data left behind, and a node with an empty data directory
    /// starts on a new address, which is returned. The cluster's configuration (what routers
    /// started later, and this node's restarts, use) names the new address and directory.
    pub fn replace_node(&mut self, node: u32) -> Result<SocketAddr, SimError> {
        self.crash_node(node);
        if let Some(impostor) = self.impostors[node as usize].take() {
            impostor.stop(&self.runtime);
        }
        let (shard, replica) = self.place(node);
        let security = self.security(Role::Node)?;
        let endpoint = {
            let _guard = self.runtime.enter();
            faulty_endpoint(
                "127.0.0.1:0".parse()?,
                &security,
                &self.faults[node as usize],
            )?
        };
        let addr = endpoint.local_addr()?;
        let data = self
            ._data
            .path()
            .join(format!("replacement-{shard}-{replica}-{}", addr.port()));
        let entry = self
            .config
            .shards
            .iter_mut()
            .find(|s| s.id == shard && s.replica == replica)
            .ok_or("no such node")?;
        entry.addr = addr;
        entry.data = Some(data);
        let running = self.run_node(node, endpoint)?;
        self.nodes[node as usize] = Some(running);
        Ok(addr)
    }

    /// Every node as nodes.toml lists it, (shard, replica, address): what `zr cluster
    /// add-shard --nodes nodes.toml` sends the router.
    pub fn listed_nodes(&self) -> Vec<(u32, u32, SocketAddr)> {
        self.config
            .shards
            .iter()
            .map(|s| (s.id, s.replica, s.addr))
            .collect()
    }

    /// Starts the move to the map with `change` through `client`'s router, as `zr cluster
    /// add-shard`/`drain-shard --nodes nodes.toml` does, and waits for its end (2 minutes at
    /// most): its report, or why it stopped.
    pub fn run_move(
        &self,
        client: &Client,
        change: zr_router::MapChange,
    ) -> Result<zr_router::MoveReport, String> {
        client
            .move_shards(change, self.listed_nodes())
            .map_err(|e| e.to_string())?;
        let started = self.now();
        loop {
            self.pause(Duration::from_millis(50));
            let report = client.move_progress().map_err(|e| e.to_string())?;
            if let Some(ended) = move_ended(report, self.now() - started)? {
                return Ok(ended);
            }
        }
    }

    /// [`SimCluster::run_move`] through an async client, on the cluster's clock (a cluster
    /// on virtual time: inside [`SimCluster::run`]).
    pub async fn run_move_async(
        &self,
        client: &AsyncClient,
        change: zr_router::MapChange,
    ) -> Result<zr_router::MoveReport, String> {
        client
            .move_shards(change, self.listed_nodes())
            .await
            .map_err(|e| e.to_string())?;
        let started = tokio::time::Instant::now();
        loop {
            tokio::time::sleep(Duration::from_millis(50)).await;
            let report = client.move_progress().await.map_err(|e| e.to_string())?;
            if let Some(ended) = move_ended(report, started.elapsed())? {
                return Ok(ended);
            }
        }
    }

    /// Starts the nodes of one shard more (empty, on new addresses), as `zr cluster
    /// add-shard` expects them, and adds them to the cluster's configuration (`shards` one
    /// more): routers started from now on know them. Returns the new shard's id.
    pub fn add_shard_nodes(&mut self) -> Result<u32, SimError> {
        let shard = self.config.cluster.shards;
        let replicas = self.config.cluster.replicas;
        let security = self.security(Role::Node)?;
        let mut started = Vec::new();
        for replica in 0..replicas {
            let node = shard * replicas + replica;
            let state = Arc::new(FaultState::new(self.seed, node));
            let endpoint = {
                let _guard = self.runtime.enter();
                faulty_endpoint("127.0.0.1:0".parse()?, &security, &state)?
            };
            let dir = if replica == 0 {
                format!("shard-{shard}")
            } else {
                format!("shard-{shard}-r{replica}")
            };
            self.config.shards.push(ShardConfig {
                id: shard,
                replica,
                addr: endpoint.local_addr()?,
                data: Some(self._data.path().join(dir)),
                metrics: None,
            });
            self.faults.push(state);
            self.ship_faults.push(Arc::default());
            self.impostors.push(None);
            started.push((node, endpoint));
        }
        self.config.cluster.shards += 1;
        for (node, endpoint) in started {
            let running = self.run_node(node, endpoint)?;
            self.nodes.push(Some(running));
        }
        Ok(shard)
    }

    /// Binds shard `shard`'s address again. In one process the old node's socket stays open
    /// until its endpoint's connections have drained (a separate process frees it at exit),
    /// which takes up to the transport's idle timeout (10 s) when a connection was left
    /// mid-handshake: wait for it, up to 15 s.
    fn bind_node(&self, shard: u32) -> Result<quinn::Endpoint, SimError> {
        const REBIND_WAIT: Duration = Duration::from_secs(15);
        let (id, replica) = self.place(shard);
        let addr = self.config.node(id, replica).ok_or("no such node")?.addr;
        let security = self.security(Role::Node)?;
        let started = std::time::Instant::now();
        let endpoint = loop {
            let bound = {
                let _guard = self.runtime.enter();
                faulty_endpoint(addr, &security, &self.faults[shard as usize])
            };
            match bound {
                Ok(endpoint) => break endpoint,
                Err(_) if started.elapsed() < REBIND_WAIT => {
                    // Waiting on the runtime lets the old endpoint drain meanwhile.
                    self.run(async { tokio::time::sleep(Duration::from_millis(20)).await });
                }
                Err(e) => return Err(e.into()),
            }
        };
        Ok(endpoint)
    }

    pub(crate) fn finish(&self, running: Running) -> Result<(), SimError> {
        let _ = running.stop.send(());
        self.runtime.block_on(running.task)?.map_err(SimError::from)
    }
}

/// A node's endpoint on `addr`, its socket suffering the faults `state` says.
pub(crate) fn faulty_endpoint(
    addr: SocketAddr,
    security: &Security,
    state: &Arc<FaultState>,
) -> Result<quinn::Endpoint, net::Error> {
    net::server_endpoint_wrapped(addr, security, |inner| {
        Arc::new(FaultySocket {
            inner,
            state: Arc::clone(state),
        })
    })
}

/// A move's progress as [`SimCluster::run_move`] judges it after `waited`: its report once
/// done, why it stopped, or `None` while it runs (2 minutes at most).
fn move_ended(
    report: Option<zr_router::MoveReport>,
    waited: Duration,
) -> Result<Option<zr_router::MoveReport>, String> {
    let report = report.ok_or("the router runs no move")?;
    if let Some(error) = report.error {
        return Err(error);
    }
    if report.done {
        return Ok(Some(report));
    }
    if waited > Duration::from_secs(120) {
        return Err(format!("the move did not end within 2 minutes: {report:?}"));
    }
    Ok(None)
}
