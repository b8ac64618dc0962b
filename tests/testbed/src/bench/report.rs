//! Tables on stdout and the method notes.

/// A plain text table: first column left-aligned, the others right-aligned.
pub struct Table {
    title: String,
    rows: Vec<Vec<String>>,
}

impl Table {
    pub fn new(title: &str, header: &[&str]) -> Table {
        Table { title: title.to_string(), rows: vec![header.iter().map(|h| h.to_string()).collect()] }
    }

    pub fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }

    pub fn print(&self) {
        println!("\n{}", self.title);
        let columns = self.rows.iter().map(Vec::len).max().unwrap_or(0);
        let width = |c: usize| self.rows.iter().filter_map(|r| r.get(c)).map(|s| s.chars().count()).max().unwrap_or(0);
        let widths: Vec<usize> = (0..columns).map(width).collect();
        for row in &self.rows {
            let mut line = String::from(" ");
            for (c, cell) in row.iter().enumerate() {
                if c == 0 {
                    line.push_str(&format!(" {cell:<w$}", w = widths[0]));
                } else {
                    line.push_str(&format!("  {cell:>w$}", w = widths[c]));
                }
            }
            println!("{}", line.trim_end());
        }
    }
}

pub fn opt(value: Option<f64>, decimals: usize) -> String {
    value.map_or_else(|| "-".to_string(), |v| format!("{v:.decimals$}"))
}

/// `count` per volume; `None` without volumes.
pub fn per_volume(count: u64, volumes: usize) -> Option<f64> {
    (volumes > 0).then(|| count as f64 / volumes as f64)
}

/// How each figure is obtained; printed at the end and stored in the JSON.
pub const METHOD: &[&str] = &[
    "latency: each watch event is stamped with the bench's monotonic clock on arrival (API \
     timestamps have 1 s resolution). Start: first event of the claim (provisionOnNode) or first \
     event carrying volume.kubernetes.io/selected-node (WaitForFirstConsumer); end: first event \
     of PV pvc-<uid>. Both ends come through the same API server watch path, so its delay mostly \
     cancels; resolution ~1 ms, worse when the 2 CPUs are saturated. Two separate watch streams: \
     a PV seen before its claim event counts as 0 (reported in the JSON).",
    "PVs/s: (n-1) / (last PV seen - first PV seen). Scenarios a and b are capped by the arrival \
     rate; c creates claims as fast as --clients clients can, which is the capacity figure.",
    "reference (r): a minimal provisioner inside the bench (bench/reference.rs) watches claims \
     and creates the PV of each claim of its class, nothing else: no directory, no event. Same \
     control plane, same nodes and load as c (Immediate, provisionOnNode round-robin, burst), \
     run right before c in the same sitting; it runs only during r. Ours as a fraction of it = \
     c PVs/s / r PVs/s; with --reference-rounds K, K pairs (r then c) alternate and the median \
     of their fractions is reported. r's deletion figures time the bench's own deletecollection of its PVs.",
    "plot: the SVG next to the JSON shows each scenario's latency distribution (share of claims \
     against latency, log scale) and PVs seen against seconds since its first create request.",
    "API requests of the provisioners: EXACT, from the API server's audit log. Each provisioner \
     runs as its own ServiceAccount (bound to the ClusterRole of deploy/legacy/rbac.yaml) and the \
     audit policy logs only those users (Metadata level). A watch counts once when it starts.",
    "apiserver_request_total: every client's requests (delta over the window); 'bench' is the \
     bench's own count of its calls (exact for writes); 'total - bench' = provisioners + \
     kube-controller-manager + kube-scheduler. The provisioners' own count is shown only if they \
     export one (none did when this bench was written).",
    "CPU of the control plane and of the bench: /proc/<pid>/stat over each window. Machine CPU \
     busy: /proc/stat over the window, all processes, including work that is not the bench's on \
     a shared machine. Near 100 %, every latency and rate here is CPU-bound, not provisioner-bound.",
    "writes per volume: provisioner create/update/patch/delete requests (audit) / volumes, events \
     (core and events.k8s.io) counted apart. Event objects: events.k8s.io list of the scenario's \
     namespace, reportingController kubevirt.io/hostpath-provisioner.",
    "RSS: VmRSS / VmHWM from /proc/<pid>/status; CPU: utime+stime from /proc/<pid>/stat \
     (all threads) divided by the clock tick rate. Provisioners run with RUST_LOG as given \
     (default info), release build as make bench builds it. Each scenario's peak is its own: \
     the bench resets every provisioner's VmHWM (5 to /proc/<pid>/clear_refs) before it starts; \
     the peak per provisioner of the whole run is the largest of those and the last reading.",
    "memory (run last): the cluster is filled with --memory-claims claims that are not the \
     measured node's (half another provisioner's class, a quarter ours with selected-node naming \
     another node, a quarter ours bound on other nodes, one in 400 pinned to a node without a \
     provisioner), each created by a server-side apply of manager helm \
     and changed by one of argocd-controller, with Helm/Argo CD labels and annotations and a \
     1-2 KiB last-applied-configuration. kube-controller-manager and the other provisioners are \
     stopped first. A fresh provisioner then starts; RSS/peak are read 3 s after its /readyz \
     (watches listed), after 100 own claims (WaitForFirstConsumer, selected-node = it) have PVs, \
     and after 1,000; per own claim = (RSS at 1,000 - RSS at 100) / 900. The goal is judged on \
     the peak after the 100.",
    "many-files deletion: the bench writes empty files into the volume's directory, deletes the \
     claim, and times PV phase Released (watch) -> PV deleted (watch) and -> directory gone (polled every 2 ms).",
];
