//! The directory tree of one checkpoint, built once from its immutable manifest.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::catalog::Manifest;
use crate::store::ObjectId;

#[derive(Debug)]
pub enum NodeKind {
    /// Children as indices into [`CheckpointTree::nodes`], sorted by name.
    Dir(Vec<usize>),
    File {
        object: ObjectId,
        size: u64,
    },
}

#[derive(Debug)]
pub struct Node {
    pub name: String,
    pub parent: usize,
    pub kind: NodeKind,
}

/// `cp-N/<operator>/<subtask>/<file>`. Node 0 is `cp-N` itself; a node's inode number is
/// `N << 32 | index`, stable for as long as the checkpoint exists and across remounts.
#[derive(Debug)]
pub struct CheckpointTree {
    pub id: u64,
    pub mtime: SystemTime,
    pub nodes: Vec<Node>,
}

impl CheckpointTree {
    /// `cp-N/operator/subtask/file` of a node, for messages.
    pub fn path_of(&self, mut index: usize) -> String {
        let mut parts = vec![self.nodes[index].name.as_str()];
        while index != 0 {
            index = self.nodes[index].parent;
            parts.push(self.nodes[index].name.as_str());
        }
        parts.reverse();
        parts.join("/")
    }

    pub fn build(manifest: &Manifest) -> Self {
        let mut nodes = vec![Node {
            name: format!("cp-{}", manifest.id),
            parent: 0,
            kind: NodeKind::Dir(Vec::new()),
        }];
        let mut operators: BTreeMap<&str, usize> = BTreeMap::new();
        let mut backends: Vec<_> = manifest.backends.iter().collect();
        backends.sort_by(|a, b| a.name.cmp(&b.name));
        for backend in backends {
            let op = *operators.entry(backend.name.operator()).or_insert_with(|| {
                push(
                    &mut nodes,
                    0,
                    backend.name.operator().into(),
                    NodeKind::Dir(Vec::new()),
                )
            });
            let sub = push(
                &mut nodes,
                op,
                backend.name.subtask().to_string(),
                NodeKind::Dir(Vec::new()),
            );
            let mut files: Vec<_> = backend.files.iter().collect();
            files.sort_by(|a, b| a.name.cmp(&b.name));
            for file in files {
                push(
                    &mut nodes,
                    sub,
                    file.name.clone(),
                    NodeKind::File {
                        object: file.object,
                        size: file.size,
                    },
                );
            }
        }
        // Lookups binary-search children by name ("10" sorts before "2").
        let names: Vec<String> = nodes.iter().map(|n| n.name.clone()).collect();
        for node in &mut nodes {
            if let NodeKind::Dir(children) = &mut node.kind {
                children.sort_by(|a, b| names[*a].cmp(&names[*b]));
            }
        }
        CheckpointTree {
            id: manifest.id,
            mtime: UNIX_EPOCH + Duration::from_millis(manifest.completed_unix_ms),
            nodes,
        }
    }

    pub fn child(&self, parent: usize, name: &str) -> Option<usize> {
        match &self.nodes.get(parent)?.kind {
            NodeKind::Dir(children) => children
                .binary_search_by(|c| self.nodes[*c].name.as_str().cmp(name))
                .ok()
                .map(|i| children[i]),
            NodeKind::File { .. } => None,
        }
    }
}

fn push(nodes: &mut Vec<Node>, parent: usize, name: String, kind: NodeKind) -> usize {
    let index = nodes.len();
    nodes.push(Node { name, parent, kind });
    if index != parent {
        if let NodeKind::Dir(children) = &mut nodes[parent].kind {
            children.push(index);
        }
    }
    index
}
