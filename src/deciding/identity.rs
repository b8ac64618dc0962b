//! Who this process is: the provisioner name it serves and the node it runs on.

/// Who we are: the provisioner name and this pod's node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Identity {
    /// Provisioner name (StorageClass `provisioner`): the events' reporting controller, and the
    /// name of the leases and promises.
    pub provisioner: String,
    /// A second name this process serves (`CAPACITY_PROVISIONER_NAME`): a DNS name, so that it
    /// can name the CSIDriver through which kube-scheduler reads published capacity while the
    /// first keeps a `/` (`kubevirt.io/hostpath-provisioner`, which no object can be named).
    pub capacity_provisioner: Option<String>,
    /// Node object name (`NODE_NAME`).
    pub node: String,
    /// The labels of this node that volumes can be pinned to (`NODE_AFFINITY_KEYS` and the
    /// Node's values, read at start; `deciding::node_affinity`).
    pub affinity: Vec<crate::deciding::node_affinity::AffinityLabel>,
}

impl Identity {
    /// Whether `name`, a StorageClass's `provisioner` or a PV's `provisioned-by`, is one of the
    /// names this process serves.
    pub fn serves(&self, name: &str) -> bool {
        name == self.provisioner || self.capacity_provisioner.as_deref() == Some(name)
    }

    /// Every name this process serves, the first one first.
    pub fn names(&self) -> Vec<&str> {
        [Some(self.provisioner.as_str()), self.capacity_provisioner.as_deref()].into_iter().flatten().collect()
    }

    /// The names whose classes get published capacity: those that can name a CSIDriver.
    pub fn publishable_names(&self) -> Vec<&str> {
        self.names().into_iter().filter(|name| crate::deciding::layout::is_dns_subdomain(name)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn me(capacity_provisioner: Option<&str>) -> Identity {
        Identity {
            provisioner: "kubevirt.io/hostpath-provisioner".into(),
            capacity_provisioner: capacity_provisioner.map(str::to_owned),
            node: "node-a".into(),
            affinity: Vec::new(),
        }
    }

    #[test]
    fn the_capacity_name_is_served_beside_the_first_and_alone_publishable() {
        let both = me(Some("hostpath.example.org"));
        assert!(both.serves("kubevirt.io/hostpath-provisioner") && both.serves("hostpath.example.org"));
        assert!(!both.serves("example.com/other") && !both.serves(""));
        assert_eq!(both.publishable_names(), ["hostpath.example.org"]);
        let one = me(None);
        assert!(one.serves("kubevirt.io/hostpath-provisioner") && !one.serves("hostpath.example.org"));
        assert!(one.publishable_names().is_empty(), "a name with '/' can name no CSIDriver");
    }
}
