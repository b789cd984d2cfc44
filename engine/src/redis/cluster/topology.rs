//! What the Cluster's watch knows of the topology: the nodes `CLUSTER SLOTS` answers name,
//! each with its role, and which of them to stop watching. Bookkeeping only; the watch
//! (`watch`) asks the nodes and starts or ends their `node_watch`.
//!
//! An answer is trusted only as far as it can be: one that names no primary (a node
//! restarted without its `nodes.conf`, or after `CLUSTER RESET`, answers an empty list)
//! tells nothing, and one node's answer alone never ends the watch on another (it may be
//! stale, or cut off from the rest). A node is no longer watched once [`ABSENT_POLLS`]
//! answers in a row have left it out, from at least two different nodes; the watch never
//! ends the watch on every node.

use std::collections::{HashMap, HashSet};

use redis::Value;

/// A node's address, as `CLUSTER SLOTS` gives it.
pub(super) type Addr = (String, u16);

/// How many answers in a row must leave a node out before it is no longer watched.
pub(super) const ABSENT_POLLS: u32 = 3;

/// How many different nodes must have left a node out before it is no longer watched
/// (or every other node known, when fewer are).
const ABSENT_FROM: usize = 2;

/// A node's role, as the latest answer that named it gave it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Role {
    Primary,
    Replica,
}

/// One `CLUSTER SLOTS` answer: every node it names, once each, with its role.
#[derive(Debug, Default)]
pub(super) struct Answer(pub(super) Vec<(Addr, Role)>);

impl Answer {
    /// Whether it tells anything: a node that knows no cluster answers no slot at all.
    pub(super) fn is_informative(&self) -> bool {
        self.0.iter().any(|(_, role)| *role == Role::Primary)
    }
}

/// The nodes known, and the order they are asked in.
#[derive(Debug, Default)]
pub(super) struct Topology {
    nodes: HashMap<Addr, Known>,
    /// Polls so far: each starts asking at a different node.
    polls: usize,
}

#[derive(Debug)]
struct Known {
    role: Role,
    /// Answers in a row that left it out.
    absent: u32,
    /// The nodes whose answers left it out since one last named it.
    left_out_by: HashSet<Addr>,
}

/// What an answer changed: the nodes to watch from now on, those no longer to watch.
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct Change {
    pub(super) added: Vec<Addr>,
    pub(super) removed: Vec<Addr>,
}

impl Topology {
    /// Take in `answer`, given by `answered_by`. An answer that tells nothing changes
    /// nothing.
    pub(super) fn follow(&mut self, answered_by: &Addr, answer: &Answer) -> Change {
        let mut change = Change::default();
        if !answer.is_informative() {
            return change;
        }
        for (addr, known) in &mut self.nodes {
            if !answer.0.iter().any(|(named, _)| named == addr) {
                known.absent += 1;
                known.left_out_by.insert(answered_by.clone());
            }
        }
        for (addr, role) in &answer.0 {
            match self.nodes.get_mut(addr) {
                Some(known) => {
                    known.role = *role;
                    known.absent = 0;
                    known.left_out_by.clear();
                }
                None => {
                    self.nodes.insert(
                        addr.clone(),
                        Known {
                            role: *role,
                            absent: 0,
                            left_out_by: HashSet::new(),
                        },
                    );
                    change.added.push(addr.clone());
                }
            }
        }
        let others = self.nodes.len().saturating_sub(1);
        let gone: Vec<Addr> = self
            .nodes
            .iter()
            .filter(|(_, known)| {
                known.absent >= ABSENT_POLLS
                    && known.left_out_by.len() >= ABSENT_FROM.min(others).max(1)
            })
            .map(|(addr, _)| addr.clone())
            .collect();
        // Never every node: some watch must remain to be asked (the seeds are asked when
        // none answers).
        if gone.len() < self.nodes.len() {
            for addr in &gone {
                self.nodes.remove(addr);
            }
            change.removed = gone;
        }
        change
    }

    /// The nodes to ask this poll, in order: a different one first each poll, so one
    /// node's stale view cannot be the only one heard.
    pub(super) fn ask_order(&mut self) -> Vec<Addr> {
        let mut order: Vec<Addr> = self.nodes.keys().cloned().collect();
        order.sort();
        if !order.is_empty() {
            let first = self.polls % order.len();
            order.rotate_left(first);
        }
        self.polls = self.polls.wrapping_add(1);
        order
    }

    /// `addr`'s role, as the latest answer naming it gave it; `None` for a node unknown.
    pub(super) fn role(&self, addr: &Addr) -> Option<Role> {
        self.nodes.get(addr).map(|known| known.role)
    }
}

/// Every node a `CLUSTER SLOTS` reply names (each range's primary, then its replicas), once
/// each. A node with no host given is the answering node's host (`answered_by`); one with
/// an unknown address (`?`) is left out.
pub(super) fn parse(slots: &Value, answered_by: &str) -> Answer {
    let mut nodes: Vec<(Addr, Role)> = Vec::new();
    let Value::Array(ranges) = slots else {
        return Answer(nodes);
    };
    for range in ranges {
        let Value::Array(range) = range else { continue };
        for (i, node) in range.iter().enumerate().skip(2) {
            let Value::Array(node) = node else { continue };
            let host = match node.first() {
                Some(Value::BulkString(host)) => String::from_utf8_lossy(host).into_owned(),
                Some(Value::SimpleString(host)) => host.clone(),
                Some(Value::Nil) => String::new(),
                _ => continue,
            };
            let host = match host.as_str() {
                "?" => continue,
                "" | "0.0.0.0" | "::" => answered_by.to_owned(),
                _ => host,
            };
            let Some(Value::Int(port)) = node.get(1) else {
                continue;
            };
            let Ok(port) = u16::try_from(*port) else {
                continue;
            };
            let role = if i == 2 { Role::Primary } else { Role::Replica };
            if port == 0 {
                continue;
            }
            match nodes
                .iter_mut()
                .find(|((h, p), _)| *h == host && *p == port)
            {
                // Primary anywhere is primary.
                Some((_, known)) => {
                    if role == Role::Primary {
                        *known = role;
                    }
                }
                None => nodes.push(((host, port), role)),
            }
        }
    }
    Answer(nodes)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(host: &str, port: i64) -> Value {
        Value::Array(vec![
            Value::BulkString(host.as_bytes().to_vec()),
            Value::Int(port),
            Value::BulkString(b"id".to_vec()),
        ])
    }

    fn addr(port: u16) -> Addr {
        ("127.0.0.1".to_owned(), port)
    }

    /// Two shards: primaries 1 and 2, their replicas 3 and 4.
    fn full() -> Answer {
        Answer(vec![
            (addr(1), Role::Primary),
            (addr(3), Role::Replica),
            (addr(2), Role::Primary),
            (addr(4), Role::Replica),
        ])
    }

    fn known(topology: &Topology) -> Vec<Addr> {
        let mut known: Vec<Addr> = topology.nodes.keys().cloned().collect();
        known.sort();
        known
    }

    #[test]
    fn every_primary_and_replica_once_with_the_answering_host_for_a_missing_one() {
        let slots = Value::Array(vec![
            Value::Array(vec![
                Value::Int(0),
                Value::Int(10),
                node("10.0.0.1", 7000),
                node("", 7001),
            ]),
            Value::Array(vec![
                Value::Int(11),
                Value::Int(20),
                node("10.0.0.1", 7000),
                node("?", 7002),
            ]),
        ]);
        assert_eq!(
            parse(&slots, "seed").0,
            vec![
                (("10.0.0.1".to_owned(), 7000), Role::Primary),
                (("seed".to_owned(), 7001), Role::Replica)
            ]
        );
    }

    #[test]
    fn empty_answers_leave_every_node_watched() {
        let mut topology = Topology::default();
        topology.follow(&addr(1), &full());
        // A node restarted without its nodes.conf, or after CLUSTER RESET, answers so.
        let empty = parse(&Value::Array(vec![]), "127.0.0.1");
        for asked in [1, 2, 3, 4, 1, 2] {
            assert_eq!(topology.follow(&addr(asked), &empty), Change::default());
        }
        assert_eq!(known(&topology), vec![addr(1), addr(2), addr(3), addr(4)]);
    }

    #[test]
    fn one_nodes_stale_answer_alone_unwatches_no_other() {
        let mut topology = Topology::default();
        topology.follow(&addr(1), &full());
        // Node 1's stale view: no node 2 or 4.
        let stale = Answer(vec![(addr(1), Role::Primary), (addr(3), Role::Replica)]);
        for _ in 0..5 {
            assert_eq!(topology.follow(&addr(1), &stale), Change::default());
        }
        assert_eq!(known(&topology), vec![addr(1), addr(2), addr(3), addr(4)]);
        // Another node agrees: 2 and 4 have left the cluster.
        let change = topology.follow(&addr(3), &stale);
        let mut removed = change.removed;
        removed.sort();
        assert_eq!(removed, vec![addr(2), addr(4)]);
        assert_eq!(known(&topology), vec![addr(1), addr(3)]);
    }

    #[test]
    fn a_node_named_again_starts_its_count_over() {
        let mut topology = Topology::default();
        topology.follow(&addr(1), &full());
        let stale = Answer(vec![(addr(1), Role::Primary), (addr(3), Role::Replica)]);
        topology.follow(&addr(1), &stale);
        topology.follow(&addr(3), &stale);
        topology.follow(&addr(2), &full());
        assert_eq!(topology.follow(&addr(1), &stale), Change::default());
        assert_eq!(known(&topology), vec![addr(1), addr(2), addr(3), addr(4)]);
    }

    #[test]
    fn each_poll_asks_a_different_node_first() {
        let mut topology = Topology::default();
        topology.follow(&addr(1), &full());
        let firsts: HashSet<Addr> = (0..4).map(|_| topology.ask_order()[0].clone()).collect();
        assert_eq!(
            firsts.len(),
            4,
            "every node is asked first once in four polls"
        );
    }

    #[test]
    fn the_latest_answer_gives_the_role() {
        let mut topology = Topology::default();
        topology.follow(&addr(1), &full());
        assert_eq!(topology.role(&addr(3)), Some(Role::Replica));
        // A failover: 3 is primary, 1 its replica.
        let after = Answer(vec![
            (addr(3), Role::Primary),
            (addr(1), Role::Replica),
            (addr(2), Role::Primary),
            (addr(4), Role::Replica),
        ]);
        topology.follow(&addr(2), &after);
        assert_eq!(topology.role(&addr(3)), Some(Role::Primary));
        assert_eq!(topology.role(&addr(1)), Some(Role::Replica));
        assert_eq!(topology.role(&addr(9)), None);
    }
}
