//! How a pool (or the subscriber) opens a connection to the server it serves: the one Redis of
//! `redis_url`, the primary that Sentinel names right now, or any node of a Cluster.
//!
//! Sentinel discovery asks each sentinel `SENTINEL GET-MASTER-ADDR-BY-NAME` on a connection of
//! our own with `connect_timeout` for both the connect and the reply, then checks the named
//! server's `ROLE`. The redis crate's `sentinel` module does the same asking without any read
//! timeout on its sentinel connections (a stopped sentinel would hang a connector thread for
//! good), so only its connection types are used here. A `+switch-master` announcement, heard by
//! a thread of this process on one sentinel, bumps `generation`: every connection opened before
//! it is dropped on its next checkout, and the subscriber resubscribes on the new primary.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::thread;
use std::time::{Duration, Instant};

use redis::{
    ClientTlsConfig, ConnectionAddr, ConnectionInfo, ErrorKind, IntoConnectionInfo, RedisError,
    RedisResult, TlsCertificates,
};

use crate::gvl;
use crate::per_process::PerProcess;
use crate::replies::is_signalled;

/// How long the `+switch-master` listener blocks before looking whether its Locker is gone.
const WATCH_POLL: Duration = Duration::from_millis(500);
/// Pause before the listener tries the next sentinel.
const WATCH_PAUSE: Duration = Duration::from_millis(200);
/// The least time a sentinel is given to answer, however little is left.
const MIN_ASK: Duration = Duration::from_millis(20);

#[derive(Clone)]
pub enum Connector {
    /// One server (`redis_url`, or one Cluster node).
    Direct(Box<redis::Client>),
    /// The primary Sentinel names at connect time.
    Sentinel(Arc<SentinelMaster>),
    /// The first of these that answers (the subscriber of a Cluster: a publication reaches
    /// every node).
    AnyOf(Arc<AnyOf>),
}

pub struct AnyOf {
    clients: Vec<redis::Client>,
    next: AtomicUsize,
}

impl Connector {
    pub fn any_of(clients: Vec<redis::Client>) -> Self {
        Connector::AnyOf(Arc::new(AnyOf {
            clients,
            next: AtomicUsize::new(0),
        }))
    }

    /// A connection with `timeout` on the connect and on each reply of the handshake.
    pub fn connect(&self, timeout: Duration) -> RedisResult<redis::Connection> {
        match self {
            Connector::Direct(client) => client.get_connection_with_timeout(timeout),
            Connector::Sentinel(master) => master.connect(timeout),
            Connector::AnyOf(any) => {
                let mut last = None;
                for _ in 0..any.clients.len() {
                    let at = any.next.fetch_add(1, Ordering::Relaxed) % any.clients.len();
                    match any.clients[at].get_connection_with_timeout(timeout) {
                        Ok(conn) => {
                            // Start from this one next time: it answered.
                            any.next.store(at, Ordering::Relaxed);
                            return Ok(conn);
                        }
                        Err(error) => last = Some(error),
                    }
                }
                Err(last.unwrap_or_else(|| unreachable_error("no Cluster node to listen on")))
            }
        }
    }

    /// Whether its connections are TLS ones (see `gvl::with_signals_held`).
    pub fn is_tls(&self) -> bool {
        match self {
            Connector::Direct(client) => is_tls(client.get_connection_info()),
            Connector::Sentinel(master) => is_tls(&master.primary_template),
            Connector::AnyOf(any) => any.clients.iter().any(|c| is_tls(c.get_connection_info())),
        }
    }

    /// Bumped when the server behind this connector changed (Sentinel's `+switch-master`):
    /// connections opened before lead to the old one.
    pub fn generation(&self) -> u64 {
        match self {
            Connector::Sentinel(master) => master.generation.load(Ordering::Acquire),
            _ => 0,
        }
    }

    /// For messages: where connections go now. Never carries a password.
    pub fn describe(&self) -> String {
        match self {
            Connector::Direct(client) => display_addr(client.get_connection_info().addr()),
            Connector::Sentinel(master) => master.describe(),
            Connector::AnyOf(_) => "the Redis Cluster".to_owned(),
        }
    }
}

/// What a Locker's `rediss://` connections trust and present beyond their URL: the CA of its
/// settings (instead of the system's), a client certificate (mutual TLS), and whether the
/// server's certificate is checked at all. Applied to every server a Locker talks to: the one
/// Redis, the sentinels and the primary they name, every Cluster node.
#[derive(Clone, Debug, Default)]
pub struct Tls {
    certificates: Option<TlsCertificates>,
    insecure: bool,
}

impl Tls {
    /// PEM bytes, read and checked by the Ruby layer: `ca` (one or more certificates),
    /// `client` (certificate chain, private key); `verify` false trusts any certificate.
    pub fn new(ca: Option<Vec<u8>>, client: Option<(Vec<u8>, Vec<u8>)>, verify: bool) -> Tls {
        let client_tls = client.map(|(client_cert, client_key)| ClientTlsConfig {
            client_cert,
            client_key,
        });
        let certificates = (ca.is_some() || client_tls.is_some()).then_some(TlsCertificates {
            client_tls,
            root_cert: ca,
        });
        Tls {
            certificates,
            insecure: !verify,
        }
    }

    /// A client of `info`: a `rediss://` address with this TLS, any other as it is.
    pub fn client(&self, mut info: ConnectionInfo) -> RedisResult<redis::Client> {
        let ConnectionAddr::TcpTls { host, port, .. } = info.addr() else {
            return redis::Client::open(info);
        };
        if self.insecure {
            let addr = ConnectionAddr::TcpTls {
                host: host.clone(),
                port: *port,
                insecure: true,
                tls_params: None,
            };
            info = info.set_addr(addr);
        }
        match &self.certificates {
            Some(certificates) => redis::Client::build_with_tls(info, certificates.clone()),
            None => redis::Client::open(info),
        }
    }
}

/// The primary of one Sentinel-monitored master.
pub struct SentinelMaster {
    name: String,
    sentinels: Vec<ConnectionInfo>,
    /// `redis_url`'s credentials, database and TLS: the primary's address replaces its own.
    primary_template: ConnectionInfo,
    tls: Tls,
    /// The address last named, for messages.
    current: Mutex<Option<String>>,
    /// The sentinel that answered last: asked first next time.
    answered: AtomicUsize,
    generation: AtomicU64,
    /// Whether this process's `+switch-master` listener runs.
    watching: PerProcess<()>,
}

impl SentinelMaster {
    /// `sentinels`: URLs of sentinels (with their own password, if any); `redis_url`: the
    /// primary's credentials, database and TLS; `tls`: for both.
    pub fn new(
        name: &str,
        sentinels: &[String],
        redis_url: &str,
        tls: Tls,
    ) -> Result<Arc<SentinelMaster>, String> {
        let sentinels = sentinels
            .iter()
            .map(|url| connection_info(url, "sentinels"))
            .collect::<Result<Vec<_>, _>>()?;
        let primary_template = connection_info(redis_url, "redis_url")?;
        Ok(Arc::new(SentinelMaster {
            name: name.to_owned(),
            sentinels,
            primary_template,
            tls,
            current: Mutex::new(None),
            answered: AtomicUsize::new(0),
            generation: AtomicU64::new(0),
            watching: PerProcess::new(),
        }))
    }

    fn describe(&self) -> String {
        let current = self.current.lock().ok().and_then(|c| c.clone());
        match current {
            Some(addr) => format!("{addr} (primary of {:?} by Sentinel)", self.name),
            None => format!("the primary of {:?} (by Sentinel)", self.name),
        }
    }

    /// Asks the sentinels for the primary, connects to it, and checks that it is one.
    fn connect(self: &Arc<Self>, timeout: Duration) -> RedisResult<redis::Connection> {
        self.watch();
        let info = self.discover(timeout)?;
        let addr = display_addr(info.addr());
        if let Ok(mut current) = self.current.lock() {
            *current = Some(addr.clone());
        }
        let mut conn = self
            .tls
            .client(info)?
            .get_connection_with_timeout(timeout)?;
        conn.set_read_timeout(Some(timeout))?;
        let role: Vec<redis::Value> = redis::cmd("ROLE").query(&mut conn)?;
        match role.first() {
            Some(redis::Value::BulkString(word)) if word == b"master" => Ok(conn),
            _ => Err(RedisError::from((
                ErrorKind::Server(redis::ServerErrorKind::ReadOnly),
                "Sentinel named a server that is not a primary (a failover is under way)",
                addr,
            ))),
        }
    }

    /// The primary's connection info, from the first sentinel that knows it, starting with the
    /// one that answered last. All of them together get `timeout`, shared among those not yet
    /// asked: stopped sentinels cost `timeout` in all, not `timeout` each.
    fn discover(&self, timeout: Duration) -> RedisResult<ConnectionInfo> {
        let mut last = None;
        let deadline = Instant::now() + timeout;
        let count = self.sentinels.len();
        let first = self.answered.load(Ordering::Relaxed);
        for asked_before in 0..count {
            let at = (first + asked_before) % count;
            let sentinel = &self.sentinels[at];
            let left = deadline.saturating_duration_since(Instant::now());
            let share = (left / u32::try_from(count - asked_before).unwrap_or(1)).max(MIN_ASK);
            match ask_sentinel(&self.tls, sentinel, &self.name, share) {
                Ok(Some((host, port))) => {
                    self.answered.store(at, Ordering::Relaxed);
                    let addr = with_host_port(self.primary_template.addr(), host, port);
                    return Ok(self.primary_template.clone().set_addr(addr));
                }
                Ok(None) => {
                    last = Some(unreachable_error(&format!(
                        "sentinel at {} does not know a master named {:?}",
                        display_addr(sentinel.addr()),
                        self.name
                    )))
                }
                Err(error) => {
                    last = Some(RedisError::from((
                        ErrorKind::Io,
                        "no sentinel answered",
                        format!("{} said: {error}", display_addr(sentinel.addr())),
                    )))
                }
            }
        }
        Err(last.unwrap_or_else(|| unreachable_error("no sentinel given")))
    }

    /// Starts this process's `+switch-master` listener once.
    fn watch(self: &Arc<Self>) {
        let (_, created) = self.watching.get_or_create(|| ());
        if !created {
            return;
        }
        let master = Arc::downgrade(self);
        let _ = thread::Builder::new()
            .name("lock_manager-sentinel".into())
            .spawn(move || {
                gvl::block_signals_in_this_thread();
                watch_switches(&master);
            });
    }
}

/// `SENTINEL GET-MASTER-ADDR-BY-NAME` within `timeout` (connect, handshake and reply): `None`
/// when this sentinel does not know the name.
fn ask_sentinel(
    tls: &Tls,
    sentinel: &ConnectionInfo,
    name: &str,
    timeout: Duration,
) -> RedisResult<Option<(String, u16)>> {
    let started = Instant::now();
    let mut conn = tls
        .client(sentinel.clone())?
        .get_connection_with_timeout(timeout)?;
    let left = timeout.saturating_sub(started.elapsed()).max(MIN_ASK);
    conn.set_read_timeout(Some(left))?;
    conn.set_write_timeout(Some(left))?;
    redis::cmd("SENTINEL")
        .arg("GET-MASTER-ADDR-BY-NAME")
        .arg(name)
        .query::<Option<(String, u16)>>(&mut conn)
}

/// Listens for `+switch-master` on one sentinel after another until the master is dropped.
fn watch_switches(master: &Weak<SentinelMaster>) {
    let mut at = 0;
    loop {
        let Some(strong) = master.upgrade() else {
            return;
        };
        let sentinel = strong.sentinels[at % strong.sentinels.len()].clone();
        let (name, tls) = (strong.name.clone(), strong.tls.clone());
        drop(strong);
        let _ = listen_for_switches(master, &tls, sentinel, &name);
        at += 1;
        thread::sleep(WATCH_PAUSE);
    }
}

fn listen_for_switches(
    master: &Weak<SentinelMaster>,
    tls: &Tls,
    sentinel: ConnectionInfo,
    name: &str,
) -> RedisResult<()> {
    let mut conn = tls
        .client(sentinel)?
        .get_connection_with_timeout(WATCH_POLL)?;
    conn.set_read_timeout(Some(WATCH_POLL))?;
    let mut pubsub = conn.as_pubsub();
    pubsub.subscribe("+switch-master")?;
    loop {
        let Some(strong) = master.upgrade() else {
            return Ok(());
        };
        match pubsub.get_message() {
            Ok(message) => {
                let payload: String = message.get_payload().unwrap_or_default();
                if payload.split(' ').next() == Some(name) {
                    strong.generation.fetch_add(1, Ordering::AcqRel);
                }
            }
            Err(error) if error.is_timeout() || is_signalled(&error) => continue,
            Err(error) => return Err(error),
        }
    }
}

/// `addr` with another host and port, keeping its kind (TLS and its settings).
fn with_host_port(addr: &ConnectionAddr, host: String, port: u16) -> ConnectionAddr {
    match addr {
        ConnectionAddr::TcpTls {
            insecure,
            tls_params,
            ..
        } => ConnectionAddr::TcpTls {
            host,
            port,
            insecure: *insecure,
            tls_params: tls_params.clone(),
        },
        _ => ConnectionAddr::Tcp(host, port),
    }
}

/// Whether `info` is a TLS address (`rediss://`).
pub fn is_tls(info: &ConnectionInfo) -> bool {
    matches!(info.addr(), ConnectionAddr::TcpTls { .. })
}

/// `host:port` of a Cluster node as Redis names it, as a connection address like `template`'s.
pub fn node_info(template: &ConnectionInfo, node: &str) -> Option<ConnectionInfo> {
    let (host, port) = node.rsplit_once(':')?;
    let port = port.parse().ok()?;
    let host = host
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_owned();
    Some(
        template
            .clone()
            .set_addr(with_host_port(template.addr(), host, port)),
    )
}

fn unreachable_error(what: &str) -> RedisError {
    RedisError::from((ErrorKind::Io, "unreachable", what.to_owned()))
}

/// `url` (of the setting `name`) as the redis crate takes it; the message never quotes the URL.
pub fn connection_info(url: &str, name: &str) -> Result<ConnectionInfo, String> {
    parse_url(url).map_err(|why| format!("{name} has a URL that is not usable ({why})"))
}

/// `url` as the redis crate takes it, or why it cannot (never quoting the URL).
pub fn parse_url(url: &str) -> Result<ConnectionInfo, String> {
    url.into_connection_info()
        .map_err(|e| e.detail().unwrap_or("cannot parse it").to_owned())
}

/// `host:port` (or the socket path): for messages; it never carries a password.
pub fn display_addr(addr: &ConnectionAddr) -> String {
    match addr {
        ConnectionAddr::Tcp(host, port) => format!("{host}:{port}"),
        ConnectionAddr::TcpTls { host, port, .. } => format!("{host}:{port} (TLS)"),
        ConnectionAddr::Unix(path) => format!("unix:{}", path.display()),
        _ => "Redis".to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_node_keeps_the_templates_credentials_and_tls() {
        let template = "rediss://:pw@10.0.0.1:7000/0"
            .into_connection_info()
            .unwrap();
        let node = node_info(&template, "10.0.0.2:7001").unwrap();
        assert_eq!(display_addr(node.addr()), "10.0.0.2:7001 (TLS)");
        assert_eq!(node.redis_settings().password(), Some("pw"));
        let plain = "redis://10.0.0.1:7000".into_connection_info().unwrap();
        let v6 = node_info(&plain, "[::1]:7002").unwrap();
        assert_eq!(display_addr(v6.addr()), "::1:7002");
        assert!(node_info(&plain, "no-port").is_none());
    }

    #[test]
    fn messages_never_show_a_password() {
        let master = SentinelMaster::new(
            "mymaster",
            &["redis://:sentinel-secret@127.0.0.1:26379".to_owned()],
            "redis://:master-secret@127.0.0.1:6379/0",
            Tls::default(),
        )
        .unwrap();
        let described = Connector::Sentinel(master).describe();
        assert!(!described.contains("secret"), "{described}");
    }
}
