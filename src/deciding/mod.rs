//! Pure decisions: functions from plain data (claim metadata, classes, PVs, configuration, the
//! live nodes) to a decision value. Nothing here calls the API or touches the disk.

pub mod capacity;
pub mod claim;
pub mod class;
pub mod clone;
pub mod deletion;
pub mod event;
pub mod identity;
pub mod interning;
pub mod kept_volume;
pub mod layout;
pub mod liveness;
pub mod mount_table;
pub mod node_affinity;
pub mod operator;
pub mod os_disk;
pub mod path_pattern;
pub mod pool_promises;
pub mod pool_roots;
pub mod provision;
pub mod published_capacity;
pub mod quota;
pub mod reaping;
pub mod refusal;
pub mod reservations;
pub mod resize;
pub mod retention;
pub mod settings;
pub mod snapshot;
pub mod static_binding;
pub mod topology;
pub mod unserved;
pub mod volume;
pub mod volume_spec;
pub mod waiting;
pub mod watch_list;
