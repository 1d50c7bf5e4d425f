//! CUDA graph replay of a whole plan: when the bindings of the symbolic dims repeat, the plan's
//! kernels run as one `cuGraphLaunch` instead of one `cuLaunchKernel` each.
//!
//! The graph is built explicitly (`cuGraphCreate`, one `cuGraphAddKernelNode` per launched kernel,
//! each depending on the one before: the plan's launch order), not captured from a stream, so
//! that every node's handle is at hand. A run changes the arguments of some kernels only (fresh
//! output allocations, the caller's input pointers), so each node keeps the launch it was last
//! set to and `stale_nodes` names the nodes whose launch differs;
//! `cuGraphExecKernelNodeSetParams` updates those alone, then the graph is launched.
//!
//! The policy (`Replay::step`): the first run under given bindings launches kernel by kernel
//! (a one-off run should not pay for instantiating a graph); the second builds the graph and
//! launches it; later ones update and replay it. A graph belongs to one bindings: it lives beside
//! the intermediates allocated for them and is dropped (destroyed) with them when the bindings
//! change. Kernels whose grid is empty under the bindings are not in the graph, just as they are
//! not launched.

use crate::device::{driver, DeviceError};
use crate::launch::{param_array, NodeLaunch};
use cudarc::driver::{sys, DriverError};

/// How one run launches the plan's kernels.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Step {
    /// One `cuLaunchKernel` per kernel.
    Direct,
    /// Build and instantiate the graph, then launch it.
    Build,
    /// Update the stale nodes of the existing graph, then launch it.
    Replay,
}

/// The replay state of one bindings: how many runs they had, and their graph once built.
#[derive(Debug)]
pub(crate) struct Replay<G> {
    runs: u64,
    graph: Option<G>,
}

impl<G> Default for Replay<G> {
    fn default() -> Replay<G> {
        Replay {
            runs: 0,
            graph: None,
        }
    }
}

impl<G> Replay<G> {
    /// What the next run does, given whether graphs are wanted and how many kernels it launches.
    pub(crate) fn step(&self, graphs: bool, launches: usize) -> Step {
        match (graphs && launches > 0, &self.graph) {
            (false, _) => Step::Direct,
            (true, Some(_)) => Step::Replay,
            (true, None) if self.runs == 0 => Step::Direct,
            (true, None) => Step::Build,
        }
    }

    /// Counts a run, whatever its step.
    pub(crate) fn ran(&mut self) {
        self.runs += 1;
    }
}

impl Replay<KernelGraph> {
    /// Brings the graph up to `launches` and launches it on `stream`: the stale nodes of the
    /// existing graph are set again; with no graph yet, or one that cannot be updated (another
    /// sequence of kernels, or a node the driver refuses to update), a new graph is built.
    ///
    /// # Safety
    /// As for [`KernelGraph::build`] and [`KernelGraph::launch`].
    pub(crate) unsafe fn launch(
        &mut self,
        launches: &[NodeLaunch],
        function: impl Fn(&NodeLaunch) -> sys::CUfunction + Copy,
        stream: sys::CUstream,
        early_launch: bool,
        stats: &mut GraphStats,
    ) -> Result<(), DeviceError> {
        // A graph built with the other early-launch setting has the other edges: build anew.
        let updated = match &mut self.graph {
            Some(g) if g.early_launch == early_launch => {
                g.update(launches, function).ok().flatten()
            }
            _ => None,
        };
        let g = match (updated, &mut self.graph) {
            (Some(n), Some(g)) => {
                stats.node_updates += n;
                g
            }
            _ => {
                // The old graph goes before the new one is made.
                self.graph = None;
                let g = KernelGraph::build(launches, function, early_launch)
                    .map_err(driver("building the CUDA graph of the plan"))?;
                stats.graph_builds += 1;
                self.graph.insert(g)
            }
        };
        g.launch(stream)
            .map_err(driver("launching the CUDA graph of the plan"))?;
        stats.graph_launches += 1;
        Ok(())
    }
}

/// The value in `slot` if `current` says it belongs to the run's key, else a new one from
/// `make`, which replaces it (the old value is dropped first, so that its device memory and graph
/// are released before the new ones are made). This is how intermediates and graphs are kept
/// per bindings.
pub(crate) fn keyed<T, E>(
    slot: &mut Option<T>,
    current: impl Fn(&T) -> bool,
    make: impl FnOnce() -> Result<T, E>,
) -> Result<&mut T, E> {
    if !slot.as_ref().is_some_and(current) {
        *slot = None;
    }
    match *slot {
        Some(ref mut v) => Ok(v),
        None => Ok(slot.insert(make()?)),
    }
}

/// The nodes whose launch must be set again before a replay: the indices where `new` differs
/// from `old` (arguments, entry, grid, block or shared memory). `None` when the two are not the
/// same sequence of kernels, so that no update can turn one graph into the other.
pub(crate) fn stale_nodes<'a>(
    old: &'a [NodeLaunch],
    new: &'a [NodeLaunch],
) -> Option<impl Iterator<Item = usize> + 'a> {
    if old.len() != new.len() || old.iter().zip(new).any(|(o, n)| o.kernel != n.kernel) {
        return None;
    }
    Some(
        old.iter()
            .zip(new)
            .enumerate()
            .filter(|(_, (o, n))| o != n)
            .map(|(i, _)| i),
    )
}

/// What the graph path did, over the life of an executable.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GraphStats {
    /// Runs whose kernels were launched one by one.
    pub direct_runs: u64,
    /// Runs launched as one graph.
    pub graph_launches: u64,
    /// Graphs built and instantiated (one per bindings that repeated, plus any rebuild after a
    /// failed update).
    pub graph_builds: u64,
    /// Kernel nodes whose launch was set again before a replay.
    pub node_updates: u64,
}

/// The instantiated graph of one bindings, with every kernel node's handle and the launch it
/// was last set to.
pub(crate) struct KernelGraph {
    graph: sys::CUgraph,
    exec: sys::CUgraphExec,
    nodes: Vec<sys::CUgraphNode>,
    /// The launch each node was last set to, by node.
    last: Vec<NodeLaunch>,
    /// Whether early-launch entries got programmatic edges.
    early_launch: bool,
}

// SAFETY: the handles are plain driver objects of the executable's context, usable from any
// thread on which that context is current (the runtime makes it current before every use). The
// executable only touches its graph under its state mutex, so there is never concurrent use.
unsafe impl Send for KernelGraph {}

impl KernelGraph {
    /// Builds and instantiates the graph of `launches`, a linear chain in their order.
    /// `function` gives the entry each launch runs.
    ///
    /// # Safety
    /// The executable's context must be current; every function must be a live entry of it whose
    /// signature matches its launch's arguments.
    pub(crate) unsafe fn build(
        launches: &[NodeLaunch],
        function: impl Fn(&NodeLaunch) -> sys::CUfunction,
        early_launch: bool,
    ) -> Result<KernelGraph, DriverError> {
        let mut graph = std::ptr::null_mut();
        sys::cuGraphCreate(&mut graph, 0).result()?;
        // From here on, dropping `g` destroys what was built so far.
        let mut g = KernelGraph {
            graph,
            exec: std::ptr::null_mut(),
            nodes: Vec::with_capacity(launches.len()),
            last: Vec::with_capacity(launches.len()),
            early_launch,
        };
        for launch in launches {
            let mut params = param_array(&launch.args);
            let p = launch.node_params(function(launch), &mut params);
            let mut node = std::ptr::null_mut();
            // The driver copies the argument values here.
            sys::cuGraphAddKernelNode_v2(&mut node, g.graph, std::ptr::null(), 0, &p).result()?;
            if let Some(prev) = g.nodes.last() {
                // An early-launch entry depends on the kernel before through a programmatic
                // edge: it may start once every CTA of that kernel has started (or called
                // `launch_dependents`) and waits for the rest itself.
                use sys::CUgraphDependencyType as Dep;
                let (port, kind) = if early_launch && launch.early_launch {
                    (
                        sys::CU_GRAPH_KERNEL_NODE_PORT_PROGRAMMATIC,
                        Dep::CU_GRAPH_DEPENDENCY_TYPE_PROGRAMMATIC,
                    )
                } else {
                    (
                        sys::CU_GRAPH_KERNEL_NODE_PORT_DEFAULT,
                        Dep::CU_GRAPH_DEPENDENCY_TYPE_DEFAULT,
                    )
                };
                let edge = sys::CUgraphEdgeData {
                    from_port: port as u8,
                    to_port: 0,
                    type_: kind as u8,
                    reserved: [0; 5],
                };
                sys::cuGraphAddDependencies_v2(g.graph, prev, &node, &edge, 1).result()?;
            }
            g.nodes.push(node);
            g.last.push(launch.clone());
        }
        let mut exec = std::ptr::null_mut();
        sys::cuGraphInstantiateWithFlags(&mut exec, g.graph, 0).result()?;
        g.exec = exec;
        Ok(g)
    }

    /// Sets the launch of every node whose launch differs from `launches`; returns how many
    /// were set, or `None` when `launches` is another sequence of kernels (rebuild instead).
    ///
    /// # Safety
    /// As for [`KernelGraph::build`].
    pub(crate) unsafe fn update(
        &mut self,
        launches: &[NodeLaunch],
        function: impl Fn(&NodeLaunch) -> sys::CUfunction,
    ) -> Result<Option<u64>, DriverError> {
        let Some(stale) = stale_nodes(&self.last, launches) else {
            return Ok(None);
        };
        // Collected first (on the stack): `stale` borrows the launches the loop below writes.
        let stale: smallvec::SmallVec<[usize; 16]> = stale.collect();
        for &i in &stale {
            let launch = &launches[i];
            let mut params = param_array(&launch.args);
            let p = launch.node_params(function(launch), &mut params);
            sys::cuGraphExecKernelNodeSetParams_v2(self.exec, self.nodes[i], &p).result()?;
            self.last[i].clone_from(launch);
        }
        Ok(Some(stale.len() as u64))
    }

    /// Enqueues the whole graph on `stream`.
    ///
    /// # Safety
    /// The executable's context must be current and `stream` one of its streams; every pointer
    /// argument the nodes were last set to must stay live until the graph ran.
    pub(crate) unsafe fn launch(&self, stream: sys::CUstream) -> Result<(), DriverError> {
        sys::cuGraphLaunch(self.exec, stream).result()
    }
}

impl Drop for KernelGraph {
    fn drop(&mut self) {
        // SAFETY: the handles were created by `build` and are destroyed once, here. A launch
        // still in flight is not cut short: the driver frees the executable graph when it ends.
        // Errors cannot be reported from `drop`; a failing destroy leaks the graph.
        unsafe {
            if !self.exec.is_null() {
                let _ = sys::cuGraphExecDestroy(self.exec);
            }
            if !self.graph.is_null() {
                let _ = sys::cuGraphDestroy(self.graph);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::launch::{Entry, KernelArg};

    fn launch(kernel: usize, args: &[u64]) -> NodeLaunch {
        NodeLaunch {
            kernel,
            entry: Entry::Tiled,
            grid: [4, 1, 1],
            block: [256, 1, 1],
            smem_bytes: 0,
            early_launch: false,
            walk: std::sync::Arc::from(Vec::new()),
            args: args.iter().map(|&a| KernelArg::U64(a)).collect(),
        }
    }

    fn stale(old: &[NodeLaunch], new: &[NodeLaunch]) -> Option<Vec<usize>> {
        stale_nodes(old, new).map(|s| s.collect())
    }

    #[test]
    fn identical_launches_need_no_update() {
        let l = [launch(0, &[0x10, 0x20, 7]), launch(1, &[0x20, 0x30, 7])];
        assert_eq!(stale(&l, &l), Some(vec![]));
    }

    #[test]
    fn only_nodes_with_changed_arguments_are_updated() {
        let old = [
            launch(0, &[0x10, 0x20, 7]),
            launch(1, &[0x20, 0x30, 7]),
            launch(2, &[0x30, 0x40, 7]),
        ];
        // A new input pointer (first kernel) and a new output (last kernel); the middle kernel
        // reads and writes intermediates, which stay put.
        let new = [
            launch(0, &[0x11, 0x20, 7]),
            launch(1, &[0x20, 0x30, 7]),
            launch(2, &[0x30, 0x41, 7]),
        ];
        assert_eq!(stale(&old, &new), Some(vec![0, 2]));
    }

    #[test]
    fn a_changed_entry_grid_or_shared_memory_is_an_update() {
        let old = [launch(0, &[1]), launch(1, &[2]), launch(2, &[3])];
        let mut new = old.clone();
        new[0].entry = Entry::SmallM(1);
        new[1].grid = [8, 1, 1];
        new[2].smem_bytes = 1024;
        assert_eq!(stale(&old, &new), Some(vec![0, 1, 2]));
        let mut new = old.clone();
        new[1].block = [128, 1, 1];
        assert_eq!(stale(&old, &new), Some(vec![1]));
    }

    #[test]
    fn another_sequence_of_kernels_cannot_be_updated() {
        let old = [launch(0, &[1]), launch(1, &[2])];
        // A kernel skipped (empty grid) under other bindings.
        assert_eq!(stale(&old, &[launch(1, &[2])]), None);
        assert_eq!(stale(&old, &[launch(0, &[1]), launch(2, &[2])]), None);
        assert_eq!(stale(&[], &[]), Some(vec![]));
    }

    /// Simulates the runs of one bindings, building a graph (a unit) where the policy says so.
    fn steps(graphs: &[bool], launches: usize) -> Vec<Step> {
        let mut r: Replay<()> = Replay::default();
        graphs
            .iter()
            .map(|&g| {
                let s = r.step(g, launches);
                if s == Step::Build {
                    r.graph = Some(());
                }
                r.ran();
                s
            })
            .collect()
    }

    #[test]
    fn the_first_run_of_bindings_is_direct_the_second_builds_then_replays() {
        use Step::*;
        assert_eq!(
            steps(&[true, true, true, true], 2),
            [Direct, Build, Replay, Replay]
        );
    }

    #[test]
    fn graphs_off_always_launches_directly_and_still_counts_runs() {
        use Step::*;
        assert_eq!(steps(&[false, false, false], 2), [Direct, Direct, Direct]);
        // Runs without graphs count as earlier runs of the bindings.
        assert_eq!(
            steps(&[false, true, false, true], 2),
            [Direct, Build, Direct, Replay]
        );
    }

    #[test]
    fn nothing_to_launch_never_builds_a_graph() {
        assert_eq!(steps(&[true, true, true], 0), [Step::Direct; 3]);
    }

    #[test]
    fn a_graph_belongs_to_one_bindings() {
        use Step::*;
        // T changes, then changes back: each change starts over with a direct run.
        let mut slot: Option<(u64, super::Replay<()>)> = None;
        let mut made = 0;
        let got: Vec<Step> = [7, 7, 7, 300, 300, 300, 7, 7]
            .into_iter()
            .map(|t| {
                let (_, r) = keyed(
                    &mut slot,
                    |(key, _)| *key == t,
                    || {
                        made += 1;
                        Ok::<_, ()>((t, super::Replay::default()))
                    },
                )
                .unwrap();
                let s = r.step(true, 2);
                if s == Build {
                    r.graph = Some(());
                }
                r.ran();
                s
            })
            .collect();
        assert_eq!(
            got,
            [Direct, Build, Replay, Direct, Build, Replay, Direct, Build]
        );
        assert_eq!(made, 3, "one scratch per change of bindings");
    }

    #[test]
    fn a_failed_make_leaves_the_slot_empty() {
        let mut slot = Some(1);
        assert_eq!(
            keyed(&mut slot, |v| *v == 2, || Err("no memory")),
            Err("no memory")
        );
        assert_eq!(slot, None);
        assert_eq!(
            keyed(&mut slot, |v| *v == 2, || Ok::<_, ()>(2)).copied(),
            Ok(2)
        );
        assert_eq!(keyed(&mut slot, |v| *v == 2, || Err(())).copied(), Ok(2));
    }
}
