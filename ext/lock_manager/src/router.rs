//! Which pool serves a key: the one pool of a standalone Redis or of a Sentinel primary, or the
//! pool of the Cluster node that serves the key's hash slot.
//!
//! Every key one lock command touches lies in one slot (`keys.rs`), so a command goes to one
//! node. The slot map comes from `CLUSTER SLOTS`, asked of a known node on first use, after a
//! MOVED (which also moves that one slot at once), and when a node cannot be reached or says
//! CLUSTERDOWN (a failover). Each node has a pool of its own, built by the same code as a
//! standalone Redis's, so every guarantee of that pool (interruptible waits, timeouts, dropped
//! connections replaced) holds per node.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use redis::{ConnectionInfo, RedisResult, Value};

use crate::connector::{
    connection_info, display_addr, is_tls, node_info, Connector, SentinelMaster,
};
use crate::error::{LockError, Unavailable};
use crate::gvl;
use crate::keys::{hash_slot, SLOTS};
use crate::pool::{Pool, PoolSettings, Topology};

/// The slot map is asked for again at most this often (many threads see one failover at once).
const REFRESH_EVERY: Duration = Duration::from_millis(250);

pub enum Router {
    One(Arc<Pool>),
    Cluster(Box<ClusterRouter>),
}

impl Router {
    pub fn new(settings: PoolSettings) -> Result<Router, LockError> {
        match settings.topology.clone() {
            Topology::Standalone => {
                let info = connection_info(&settings.redis_url, "redis_url")
                    .map_err(LockError::Argument)?;
                let client = settings
                    .tls
                    .client(info)
                    .map_err(|e| LockError::Argument(format!("redis_url is not usable: {e}")))?;
                Ok(Router::One(Arc::new(Pool::new(
                    settings,
                    Connector::Direct(Box::new(client)),
                ))))
            }
            Topology::Sentinel { sentinels, master } => {
                let master = SentinelMaster::new(
                    &master,
                    &sentinels,
                    &settings.redis_url,
                    settings.tls.clone(),
                )
                .map_err(LockError::Argument)?;
                let connector = Connector::Sentinel(master);
                Ok(Router::One(Arc::new(Pool::new(settings, connector))))
            }
            Topology::Cluster { seeds } => Ok(Router::Cluster(Box::new(ClusterRouter::new(
                settings, &seeds,
            )?))),
        }
    }

    /// What the subscriber connects with: the pool's server, or any Cluster node (a PUBLISH
    /// reaches every node of a Cluster).
    pub fn listening_connector(&self) -> Connector {
        match self {
            Router::One(pool) => pool.connector().clone(),
            Router::Cluster(cluster) => cluster.any_node(),
        }
    }

    pub fn is_cluster(&self) -> bool {
        matches!(self, Router::Cluster(_))
    }

    /// The pool that serves `key` (a full Redis key) now.
    pub fn pool_for(&self, key: &[u8]) -> Result<Arc<Pool>, LockError> {
        match self {
            Router::One(pool) => Ok(Arc::clone(pool)),
            Router::Cluster(cluster) => cluster.pool_for(hash_slot(key)),
        }
    }

    /// The pool of each master, what a SCAN of every key goes through: the one pool, or on a
    /// Cluster the pool of each node that serves slots (the slot map asked for first, so that a
    /// failover is seen).
    pub fn masters(&self) -> Result<Vec<Arc<Pool>>, LockError> {
        match self {
            Router::One(pool) => Ok(vec![Arc::clone(pool)]),
            Router::Cluster(cluster) => cluster.masters(),
        }
    }

    /// Redis said MOVED: `key`'s slot is served by `node` now.
    pub fn moved(&self, key: &[u8], node: &str) {
        if let Router::Cluster(cluster) = self {
            cluster.moved(hash_slot(key), node);
        }
    }

    /// A node failed to answer, or said CLUSTERDOWN: the slot map may be out of date.
    pub fn topology_changed(&self) {
        if let Router::Cluster(cluster) = self {
            let _ = cluster.refresh(false);
        }
    }

    pub fn settings(&self) -> &PoolSettings {
        match self {
            Router::One(pool) => pool.settings(),
            Router::Cluster(cluster) => &cluster.settings,
        }
    }

    /// For messages that are not about one node.
    pub fn describe(&self) -> String {
        match self {
            Router::One(pool) => pool.addr(),
            Router::Cluster(_) => "the Redis Cluster".to_owned(),
        }
    }

    /// Redis's `maxmemory-policy` once connected (a Cluster: the first node's that said).
    pub fn maxmemory_policy(&self) -> Option<String> {
        self.pools().iter().find_map(|pool| pool.maxmemory_policy())
    }

    /// Connections open in this process and how many of them are idle, over every node.
    pub fn state(&self) -> (u32, u32) {
        self.pools().iter().fold((0, 0), |(open, idle), pool| {
            let (o, i) = pool.state();
            (open + o, idle + i)
        })
    }

    fn pools(&self) -> Vec<Arc<Pool>> {
        match self {
            Router::One(pool) => vec![Arc::clone(pool)],
            Router::Cluster(cluster) => cluster.nodes().into_values().collect(),
        }
    }
}

/// The slots of a Cluster and a pool per node.
pub struct ClusterRouter {
    settings: PoolSettings,
    seeds: Vec<ConnectionInfo>,
    nodes: Mutex<HashMap<String, Arc<Pool>>>,
    /// For each slot, the pool of the node serving it (`None`: not known yet).
    slots: ArcSwap<Vec<Option<Arc<Pool>>>>,
    last_refresh: Mutex<Option<Instant>>,
}

impl ClusterRouter {
    fn new(settings: PoolSettings, seeds: &[String]) -> Result<ClusterRouter, LockError> {
        let seeds = seeds
            .iter()
            .map(|url| connection_info(url, "cluster"))
            .collect::<Result<Vec<_>, _>>()
            .map_err(LockError::Argument)?;
        if seeds.is_empty() {
            return Err(LockError::Argument(
                "cluster needs at least one node URL".into(),
            ));
        }
        Ok(ClusterRouter {
            settings,
            seeds,
            nodes: Mutex::default(),
            slots: ArcSwap::from_pointee(vec![None; usize::from(SLOTS)]),
            last_refresh: Mutex::new(None),
        })
    }

    fn nodes(&self) -> HashMap<String, Arc<Pool>> {
        self.nodes.lock().map(|n| n.clone()).unwrap_or_default()
    }

    fn pool_for(&self, slot: u16) -> Result<Arc<Pool>, LockError> {
        if let Some(pool) = &self.slots.load()[usize::from(slot)] {
            return Ok(Arc::clone(pool));
        }
        self.refresh(true)?;
        self.slots.load()[usize::from(slot)]
            .clone()
            .ok_or_else(|| LockError::Unavailable {
                addr: "the Redis Cluster".into(),
                reply: format!("CLUSTERDOWN no node serves hash slot {slot}"),
                reason: Unavailable::ClusterDown,
            })
    }

    /// The pool of each node that serves slots, as the slot map says now.
    fn masters(&self) -> Result<Vec<Arc<Pool>>, LockError> {
        self.refresh(true)?;
        let mut masters: Vec<Arc<Pool>> = Vec::new();
        for pool in self.slots.load().iter().flatten() {
            if !masters.iter().any(|known| Arc::ptr_eq(known, pool)) {
                masters.push(Arc::clone(pool));
            }
        }
        Ok(masters)
    }

    /// The pool of `node` ("host:port", as Redis names it), made on first use.
    fn node(&self, node: &str) -> Option<Arc<Pool>> {
        let info = node_info(&self.seeds[0], node)?;
        let mut nodes = self.nodes.lock().ok()?;
        let key = display_addr(info.addr());
        if let Some(pool) = nodes.get(&key) {
            return Some(Arc::clone(pool));
        }
        let client = self.settings.tls.client(info).ok()?;
        let pool = Arc::new(Pool::new(
            self.settings.clone(),
            Connector::Direct(Box::new(client)),
        ));
        nodes.insert(key, Arc::clone(&pool));
        Some(pool)
    }

    fn moved(&self, slot: u16, node: &str) {
        if let Some(pool) = self.node(node) {
            self.slots.rcu(|slots| {
                let mut slots = Vec::clone(slots);
                slots[usize::from(slot)] = Some(Arc::clone(&pool));
                slots
            });
        }
        let _ = self.refresh(false);
    }

    /// Asks the known nodes, then the seeds, for the slot map, until one answers. `force`:
    /// even if it was asked for within `REFRESH_EVERY`.
    fn refresh(&self, force: bool) -> Result<(), LockError> {
        {
            let Ok(mut last) = self.last_refresh.lock() else {
                return Ok(());
            };
            if !force && last.is_some_and(|at| at.elapsed() < REFRESH_EVERY) {
                return Ok(());
            }
            *last = Some(Instant::now());
        }
        let known = self.nodes().keys().cloned().collect::<Vec<_>>();
        let mut asked = known
            .iter()
            .filter_map(|node| node_info(&self.seeds[0], node))
            .collect::<Vec<_>>();
        asked.extend(self.seeds.iter().cloned());
        let mut last_error = None;
        for info in asked {
            match self.slot_map_of(&info) {
                Ok(ranges) if !ranges.is_empty() => {
                    let mut slots = vec![None; usize::from(SLOTS)];
                    for (start, end, node) in ranges {
                        let Some(pool) = self.node(&node) else {
                            continue;
                        };
                        for slot in start..=end.min(SLOTS - 1) {
                            slots[usize::from(slot)] = Some(Arc::clone(&pool));
                        }
                    }
                    self.slots.store(Arc::new(slots));
                    return Ok(());
                }
                Ok(_) => {}
                Err(error) => last_error = Some((display_addr(info.addr()), error)),
            }
        }
        Err(match last_error {
            Some((addr, error)) => LockError::connection(&addr, error),
            None => LockError::Unavailable {
                addr: "the Redis Cluster".into(),
                reply: "CLUSTERDOWN no node serves any slot".into(),
                reason: Unavailable::ClusterDown,
            },
        })
    }

    /// `CLUSTER SLOTS` of one node: (first slot, last slot, "host:port" of its primary).
    fn slot_map_of(&self, info: &ConnectionInfo) -> RedisResult<Vec<(u16, u16, String)>> {
        let timeout = self.settings.connect_timeout;
        let client = self.settings.tls.client(info.clone())?;
        let ask = || -> RedisResult<Vec<Vec<Value>>> {
            let mut conn = client.get_connection_with_timeout(timeout)?;
            conn.set_read_timeout(Some(self.settings.read_timeout))?;
            redis::cmd("CLUSTER").arg("SLOTS").query(&mut conn)
        };
        // Asked from a Ruby thread: over TLS, with signals held (see `gvl::with_signals_held`).
        let reply = gvl::with_signals_held(is_tls(info), ask)?;
        let asked = display_addr(info.addr());
        Ok(reply
            .iter()
            .filter_map(|range| parse_slot_range(range, &asked))
            .collect())
    }

    /// The seeds, for the subscriber.
    fn any_node(&self) -> Connector {
        let clients = self
            .seeds
            .iter()
            .filter_map(|info| self.settings.tls.client(info.clone()).ok())
            .collect();
        Connector::any_of(clients)
    }
}

/// One entry of `CLUSTER SLOTS`: `[start, end, [host, port, id, ...], replicas...]`. A node
/// that does not know its own host says "" (or "?"): it is the one asked.
pub fn parse_slot_range(range: &[Value], asked: &str) -> Option<(u16, u16, String)> {
    let number = |value: &Value| match value {
        Value::Int(n) => u16::try_from(*n).ok(),
        _ => None,
    };
    let start = number(range.first()?)?;
    let end = number(range.get(1)?)?;
    let Value::Array(primary) = range.get(2)? else {
        return None;
    };
    let host = match primary.first()? {
        Value::BulkString(bytes) => String::from_utf8_lossy(bytes).into_owned(),
        Value::SimpleString(text) => text.clone(),
        _ => return None,
    };
    let port = number(primary.get(1)?)?;
    let node = match host.as_str() {
        "" | "?" => {
            let (asked_host, _) = asked.rsplit_once(':')?;
            format!("{asked_host}:{port}")
        }
        host if host.contains(':') => format!("[{host}]:{port}"),
        host => format!("{host}:{port}"),
    };
    Some((start, end, node))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bulk(text: &str) -> Value {
        Value::BulkString(text.as_bytes().to_vec())
    }

    #[test]
    fn a_slot_range_names_its_primary() {
        let range = vec![
            Value::Int(0),
            Value::Int(5460),
            Value::Array(vec![bulk("127.0.0.1"), Value::Int(7000), bulk("id")]),
            Value::Array(vec![bulk("127.0.0.1"), Value::Int(7003), bulk("id2")]),
        ];
        assert_eq!(
            parse_slot_range(&range, "127.0.0.1:7001"),
            Some((0, 5460, "127.0.0.1:7000".to_owned()))
        );
    }

    #[test]
    fn a_node_that_does_not_know_its_host_is_the_one_asked() {
        let range = vec![
            Value::Int(10),
            Value::Int(20),
            Value::Array(vec![bulk(""), Value::Int(7002)]),
        ];
        assert_eq!(
            parse_slot_range(&range, "10.0.0.9:7000"),
            Some((10, 20, "10.0.0.9:7002".to_owned()))
        );
        assert_eq!(parse_slot_range(&[Value::Int(1)], "x:1"), None);
    }
}
