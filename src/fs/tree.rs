//! The directory tree of one checkpoint, built once from its immutable manifest.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use ckptfs_core::catalog::Manifest;
use ckptfs_core::store::chunks::Chunks;
use ckptfs_core::store::ObjectId;

/// What a node of a checkpoint's tree is.
#[derive(Debug)]
pub enum NodeKind {
    /// Children as indices into [`CheckpointTree::nodes`], sorted by name.
    Dir(Vec<usize>),
    /// A backend's file.
    File {
        /// The stored object holding its bytes (or its chunk list).
        object: ObjectId,
        /// Its size in bytes.
        size: u64,
        /// Stored as chunks: served from memory, assembled and verified at open.
        chunks: Option<Box<Chunks>>,
    },
    /// A file the mount makes from what is stored (a Flink checkpoint's `_metadata`
    /// naming the mount's files), served from memory.
    Generated(std::sync::Arc<Vec<u8>>),
}

/// A directory or file of a checkpoint's tree.
#[derive(Debug)]
pub struct Node {
    /// Its name in its parent.
    pub name: String,
    /// Its parent's index (0 for `cp-N` itself).
    pub parent: usize,
    /// Directory or file.
    pub kind: NodeKind,
}

/// The trees of recently used checkpoints. A tree is rebuilt from its manifest whenever it
/// is needed again (inode numbers are stable: they come from the manifest's order), so
/// memory is bounded by `capacity`, not by the number of retained checkpoints.
pub struct TreeCache {
    trees: std::collections::HashMap<u64, (std::sync::Arc<CheckpointTree>, u64)>,
    clock: u64,
    capacity: usize,
}

impl TreeCache {
    /// A cache keeping at most `capacity` trees (at least one).
    pub fn new(capacity: usize) -> Self {
        TreeCache {
            trees: Default::default(),
            clock: 0,
            capacity: capacity.max(1),
        }
    }

    /// Checkpoint `id`'s tree, if it is built, marked as just used.
    pub fn get(&mut self, id: u64) -> Option<std::sync::Arc<CheckpointTree>> {
        self.clock += 1;
        let clock = self.clock;
        self.trees.get_mut(&id).map(|(tree, used)| {
            *used = clock;
            tree.clone()
        })
    }

    /// Insert a tree, evicting the least recently used one beyond the capacity.
    pub fn insert(&mut self, id: u64, tree: std::sync::Arc<CheckpointTree>) {
        self.clock += 1;
        self.trees.insert(id, (tree, self.clock));
        while self.trees.len() > self.capacity {
            let oldest = self
                .trees
                .iter()
                .min_by_key(|(_, (_, used))| *used)
                .map(|(id, _)| *id);
            match oldest {
                Some(id) => self.trees.remove(&id),
                None => break,
            };
        }
    }

    /// Forget checkpoint `id`'s tree (the checkpoint was dropped).
    pub fn remove(&mut self, id: &u64) {
        self.trees.remove(id);
    }

    /// How many trees are built.
    pub fn len(&self) -> usize {
        self.trees.len()
    }

    /// True when no tree is built.
    pub fn is_empty(&self) -> bool {
        self.trees.is_empty()
    }
}

/// `cp-N/<operator>/<subtask>/<file>`. Node 0 is `cp-N` itself; a node's inode number is
/// `N << 32 | index`, stable for as long as the checkpoint exists and across remounts.
#[derive(Debug)]
pub struct CheckpointTree {
    /// The checkpoint's id.
    pub id: u64,
    /// The checkpoint's time, which every node shows.
    pub mtime: SystemTime,
    /// Its directories and files; node 0 is `cp-N`.
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

    /// The tree of `manifest`'s backends and files.
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
                        chunks: file.chunks.clone(),
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

    /// The index of directory `parent`'s child `name`.
    pub fn child(&self, parent: usize, name: &str) -> Option<usize> {
        match &self.nodes.get(parent)?.kind {
            NodeKind::Dir(children) => children
                .binary_search_by(|c| self.nodes[*c].name.as_str().cmp(name))
                .ok()
                .map(|i| children[i]),
            NodeKind::File { .. } | NodeKind::Generated(_) => None,
        }
    }

    /// The objects of the next `n` files stored whole after node `index` in its directory:
    /// what a copy of the directory, opening its files in order, reads next.
    pub fn files_after(&self, index: usize, n: usize) -> Vec<ObjectId> {
        let NodeKind::Dir(children) = &self.nodes[self.nodes[index].parent].kind else {
            return Vec::new();
        };
        let Some(at) = children.iter().position(|c| *c == index) else {
            return Vec::new();
        };
        children[at + 1..]
            .iter()
            .filter_map(|c| match &self.nodes[*c].kind {
                NodeKind::File {
                    object,
                    chunks: None,
                    ..
                } => Some(*object),
                _ => None,
            })
            .take(n)
            .collect()
    }

    /// Add file `name` with these bytes at the top of the checkpoint (after every node
    /// [`CheckpointTree::build`] made, so their inode numbers stay; unless a backend's
    /// directory has that name).
    pub fn add_generated(&mut self, name: &str, bytes: Vec<u8>) {
        if self.child(0, name).is_some() {
            return;
        }
        let index = push(
            &mut self.nodes,
            0,
            name.to_string(),
            NodeKind::Generated(std::sync::Arc::new(bytes)),
        );
        let names: Vec<&str> = self.nodes.iter().map(|n| n.name.as_str()).collect();
        let mut children = match &self.nodes[0].kind {
            NodeKind::Dir(children) => children.clone(),
            _ => return,
        };
        children.sort_by(|a, b| names[*a].cmp(names[*b]));
        debug_assert!(children.contains(&index));
        self.nodes[0].kind = NodeKind::Dir(children);
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
