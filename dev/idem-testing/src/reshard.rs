//! Moving a Redis Cluster slot that holds keys from one master to another,
//! the way `redis-cli --cluster reshard` does: the target marks the slot
//! importing, the source marks it migrating, the keys go over in batches of
//! `MIGRATE … KEYS`, then every master is told the slot's new owner.
//!
//! While a slot migrates, the source answers `ASK` for a key it no longer
//! has (the target answers it after `ASKING`), and `TRYAGAIN` for a
//! multi-key command whose keys are split. Clients see both only here,
//! which is why a storm runs through it.

use std::time::{Duration, Instant};

use redis::{Connection, RedisResult};

/// A master of a cluster, as `CLUSTER NODES` names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Master {
    /// The node's id.
    pub id: String,
    /// Its client port on 127.0.0.1 (the test clusters listen there).
    pub port: u16,
}

impl Master {
    /// The node's URL.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }
}

/// What one slot move did.
#[derive(Debug, Default, Clone, Copy)]
pub struct Moved {
    /// Keys `MIGRATE` carried over.
    pub keys: usize,
    /// `MIGRATE` commands sent.
    pub batches: usize,
}

fn connect(port: u16) -> RedisResult<Connection> {
    redis::Client::open(format!("redis://127.0.0.1:{port}"))?
        .get_connection_with_timeout(Duration::from_secs(5))
}

/// The masters of the cluster that the node on `port` belongs to, by port.
pub fn masters(port: u16) -> Result<Vec<Master>, String> {
    let nodes: String = redis::cmd("CLUSTER")
        .arg("NODES")
        .query(&mut connect(port).map_err(|e| e.to_string())?)
        .map_err(|e| format!("CLUSTER NODES on {port}: {e}"))?;
    let mut masters: Vec<Master> = nodes
        .lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split(' ').collect();
            // id address flags …; the address is host:port@bus.
            let (id, address, flags) = (fields.first()?, fields.get(1)?, fields.get(2)?);
            if !flags.split(',').any(|flag| flag == "master") {
                return None;
            }
            let port = address
                .split('@')
                .next()?
                .rsplit(':')
                .next()?
                .parse()
                .ok()?;
            Some(Master {
                id: (*id).to_owned(),
                port,
            })
        })
        .collect();
    masters.sort_by_key(|master| master.port);
    Ok(masters)
}

/// The slot a Redis key hashes to, as the node on `port` computes it.
pub fn key_slot(port: u16, key: &[u8]) -> Result<u16, String> {
    redis::cmd("CLUSTER")
        .arg("KEYSLOT")
        .arg(key)
        .query(&mut connect(port).map_err(|e| e.to_string())?)
        .map_err(|e| format!("CLUSTER KEYSLOT on {port}: {e}"))
}

/// The master among `masters` that serves `slot`, as each sees it: an
/// error when they disagree.
pub fn owner(masters: &[Master], slot: u16) -> Result<Master, String> {
    let mut owner: Option<&Master> = None;
    for master in masters {
        let mut connection = connect(master.port).map_err(|e| e.to_string())?;
        let shards: redis::Value = redis::cmd("CLUSTER")
            .arg("SLOTS")
            .query(&mut connection)
            .map_err(|e| format!("CLUSTER SLOTS on {}: {e}", master.port))?;
        let port = slot_port(&shards, slot)
            .ok_or_else(|| format!("{} serves slot {slot} nowhere", master.port))?;
        let seen = masters
            .iter()
            .find(|m| m.port == port)
            .ok_or_else(|| format!("slot {slot} on unknown port {port}"))?;
        if owner.is_some_and(|owner| owner != seen) {
            return Err(format!("the masters disagree on who serves slot {slot}"));
        }
        owner = Some(seen);
    }
    owner.cloned().ok_or_else(|| "no masters given".to_owned())
}

/// The port of the master `CLUSTER SLOTS` names for `slot`.
fn slot_port(slots: &redis::Value, slot: u16) -> Option<u16> {
    let redis::Value::Array(ranges) = slots else {
        return None;
    };
    ranges.iter().find_map(|range| {
        let redis::Value::Array(fields) = range else {
            return None;
        };
        let number = |value: &redis::Value| match value {
            redis::Value::Int(n) => Some(*n),
            _ => None,
        };
        let (first, last) = (number(fields.first()?)?, number(fields.get(1)?)?);
        if !(first..=last).contains(&i64::from(slot)) {
            return None;
        }
        let redis::Value::Array(master) = fields.get(2)? else {
            return None;
        };
        u16::try_from(number(master.get(1)?)?).ok()
    })
}

/// Keys in `slot` on the master on `port`.
pub fn keys_in_slot(port: u16, slot: u16) -> Result<usize, String> {
    redis::cmd("CLUSTER")
        .arg("COUNTKEYSINSLOT")
        .arg(slot)
        .query(&mut connect(port).map_err(|e| e.to_string())?)
        .map_err(|e| format!("CLUSTER COUNTKEYSINSLOT on {port}: {e}"))
}

/// Moves `slot` from `from` to `to`, `batch` keys a `MIGRATE`, calling
/// `between` after each batch (a test waits there for its callers to act
/// on the half-moved slot). `masters` are every master of the cluster.
pub fn move_slot(
    masters: &[Master],
    slot: u16,
    from: &Master,
    to: &Master,
    batch: usize,
    mut between: impl FnMut(),
) -> Result<Moved, String> {
    let mut moving = SlotMove::start(slot, from, to)?;
    while moving.migrate(batch)? > 0 {
        between();
    }
    moving.finish(masters)
}

/// A slot on its way from one master to another: importing on the target,
/// migrating on the source, its keys moved a batch at a time.
#[derive(Debug)]
pub struct SlotMove {
    slot: u16,
    from: Master,
    to: Master,
    moved: Moved,
}

impl SlotMove {
    /// Marks `slot` importing on `to`, then migrating on `from`.
    pub fn start(slot: u16, from: &Master, to: &Master) -> Result<SlotMove, String> {
        set_slot(to.port, slot, "IMPORTING", &from.id)?;
        set_slot(from.port, slot, "MIGRATING", &to.id)?;
        Ok(SlotMove {
            slot,
            from: from.clone(),
            to: to.clone(),
            moved: Moved::default(),
        })
    }

    /// Moves up to `batch` of the slot's keys left on the source with one
    /// `MIGRATE … KEYS`, atomic for the source, which blocks while the
    /// target restores them. The keys moved; 0 when none were left.
    pub fn migrate(&mut self, batch: usize) -> Result<usize, String> {
        let (slot, from) = (self.slot, self.from.port);
        let mut source = connect(from).map_err(|e| format!("connect to {from}: {e}"))?;
        let keys: Vec<Vec<u8>> = redis::cmd("CLUSTER")
            .arg("GETKEYSINSLOT")
            .arg(slot)
            .arg(batch)
            .query(&mut source)
            .map_err(|e| format!("GETKEYSINSLOT on {from}: {e}"))?;
        if keys.is_empty() {
            return Ok(0);
        }
        let reply: String = redis::cmd("MIGRATE")
            .arg("127.0.0.1")
            .arg(self.to.port)
            .arg("")
            .arg(0)
            .arg(5000)
            .arg("KEYS")
            .arg(&keys)
            .query(&mut source)
            .map_err(|e| format!("MIGRATE on {from}: {e}"))?;
        if reply != "OK" && reply != "NOKEY" {
            return Err(format!("MIGRATE on {from}: {reply}"));
        }
        self.moved.keys += keys.len();
        self.moved.batches += 1;
        Ok(keys.len())
    }

    /// Moves the keys left, then names the target the slot's owner on every
    /// master of `masters`: the target first, then the source, then the
    /// rest; returns once every master agrees.
    pub fn finish(mut self, masters: &[Master]) -> Result<Moved, String> {
        while self.migrate(64)? > 0 {}
        let (slot, id) = (self.slot, &self.to.id);
        set_slot(self.to.port, slot, "NODE", id)?;
        set_slot(self.from.port, slot, "NODE", id)?;
        for other in masters
            .iter()
            .filter(|m| **m != self.from && **m != self.to)
        {
            set_slot(other.port, slot, "NODE", id)?;
        }
        wait_owner(masters, slot, &self.to)?;
        Ok(self.moved)
    }
}

/// `CLUSTER SETSLOT slot state id` on the master on `port`.
fn set_slot(port: u16, slot: u16, state: &str, id: &str) -> Result<(), String> {
    let mut connection = connect(port).map_err(|e| format!("connect to {port}: {e}"))?;
    redis::cmd("CLUSTER")
        .arg("SETSLOT")
        .arg(slot)
        .arg(state)
        .arg(id)
        .query(&mut connection)
        .map_err(|e| format!("SETSLOT {slot} {state} on {port}: {e}"))
}

/// Polls until every master names `to` as `slot`'s owner (20 s at most).
fn wait_owner(masters: &[Master], slot: u16, to: &Master) -> Result<(), String> {
    let give_up = Instant::now() + Duration::from_secs(20);
    loop {
        match owner(masters, slot) {
            Ok(owner) if owner == *to => return Ok(()),
            Ok(_) | Err(_) if Instant::now() < give_up => {
                std::thread::sleep(Duration::from_millis(20));
            }
            Ok(owner) => return Err(format!("slot {slot} still on {} in 20 s", owner.port)),
            Err(e) => return Err(e),
        }
    }
}
