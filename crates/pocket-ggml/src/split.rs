//! Placing a model's last layers on peers' devices (ggml's RPC backend), as llama.cpp's layer
//! split does: each layer's weights and KV cache live on one device, the scheduler runs its
//! ops there, and activations cross the link where the layers change device — once to the
//! peer and once back for the output, which stays here with the token embedding.
//!
//! A split pools memory; it does not add speed: the boards compute stage after stage.

use std::time::Duration;

use pocket_core::LayerPlacement;

use crate::error::{Error, Result};
use crate::ffi::device::{Remote, RemoteDevice, dev_memory, dev_name};
use crate::ffi::gguf::GgufFile;
use crate::rpc::probe;

/// Which layers go to peers, and which peers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SplitOptions {
    /// RPC servers (`host:port`, `pocket rpc-serve`), in the order their devices take layers.
    pub peers: Vec<String>,
    /// How many layers go to them.
    pub layers: RemoteLayers,
}

/// How many of a model's layers go to peers: always its last ones.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RemoteLayers {
    /// The last `n` layers (all of them when `n` is at least the model's count).
    Last(usize),
    /// As few as leave this machine's share of the weights (the whole-model tensors and its
    /// layers) within `local_bytes`; none if the model fits.
    Fit {
        /// The most bytes of weights this machine holds.
        local_bytes: u64,
    },
}

/// How long a peer may take to answer the probe before loading.
const PROBE_TIMEOUT: Duration = Duration::from_secs(5);

/// Room a layer's KV cache and the peer's compute buffers need beside its weights there: a
/// device takes layers while its free memory exceeds their weights by this fraction.
const PEER_HEADROOM: f64 = 0.25;

/// Where [`plan`] put the layers.
pub(crate) struct SplitPlan {
    pub(crate) remote: Remote,
    /// Bytes of the file the layers on peers take there.
    pub(crate) remote_bytes: u64,
    /// Every layer's device, in runs, this machine's (named `here`) first.
    pub(crate) placement: Vec<LayerPlacement>,
}

/// The layers of `f` (`n_layer` of them) placed on peers by `options`; the others stay on this
/// machine's device, named `here`. None: every layer stays (`Fit` found the model fits, or
/// `Last(0)`), and no peer is asked anything.
pub(crate) fn plan(
    f: &GgufFile,
    n_layer: usize,
    options: &SplitOptions,
    here: &str,
) -> Result<Option<SplitPlan>> {
    if options.peers.is_empty() {
        return Err(Error::Rpc("a split needs at least one peer".into()));
    }
    let layer_bytes = layer_bytes(f, n_layer);
    let whole_model: u64 = file_bytes(f) - layer_bytes.iter().sum::<u64>();
    let n_remote = match options.layers {
        RemoteLayers::Last(n) => n.min(n_layer),
        RemoteLayers::Fit { local_bytes } => {
            let mut local = whole_model + layer_bytes.iter().sum::<u64>();
            let mut n = 0;
            while local > local_bytes && n < n_layer {
                local -= layer_bytes[n_layer - 1 - n];
                n += 1;
            }
            if local > local_bytes {
                return Err(Error::Rpc(format!(
                    "even with every layer on peers this machine holds {} MiB of the model (its \
                     embedding and output), more than the {} MiB it may",
                    local >> 20,
                    local_bytes >> 20
                )));
            }
            n
        }
    };
    if n_remote == 0 {
        tracing::info!("the model fits here: no layers on peers");
        return Ok(None);
    }
    // A peer that is down or speaks another protocol is left out, named in the error if the
    // others cannot take the layers.
    let mut peers: Vec<(String, Option<Duration>)> = Vec::new();
    let mut down: Vec<String> = Vec::new();
    for endpoint in &options.peers {
        // A peer another model of ours is using now is serving that connection: it is asked
        // through it rather than probed.
        if crate::rpc::live_link(endpoint).is_some() {
            peers.push((endpoint.clone(), None));
            continue;
        }
        match probe(endpoint, PROBE_TIMEOUT) {
            Ok(peer) => peers.push((peer.endpoint, Some(peer.round_trip))),
            Err(e) => {
                tracing::warn!("{e}");
                down.push(e.to_string().trim_start_matches("rpc: ").to_owned());
            }
        }
    }
    if peers.is_empty() {
        return Err(Error::Rpc(down.join("; ")));
    }
    let mut devices = Vec::new();
    let mut free = Vec::new();
    let mut round_trips = Vec::new();
    for (endpoint, round_trip) in &peers {
        // ggml's client reaches the peer through our link, which it cannot abort on.
        let link = crate::rpc::link_to(endpoint)?;
        for dev in crate::ffi::rpc::add_server(link.local_endpoint())? {
            devices.push(RemoteDevice {
                dev,
                name: dev_name(dev),
                endpoint: endpoint.clone(),
                link: std::sync::Arc::clone(&link),
            });
            free.push(dev_memory(dev).0);
            round_trips.push(round_trip.or_else(|| link.stats().round_trip_min));
        }
    }
    let first_remote = n_layer - n_remote;
    let mut layers = vec![None; n_layer];
    let mut on = 0;
    let mut used = 0u64;
    for il in first_remote..n_layer {
        let need = (layer_bytes[il] as f64 * (1.0 + PEER_HEADROOM)) as u64;
        while on < devices.len() && used + need > free[on] {
            on += 1;
            used = 0;
        }
        if on == devices.len() {
            let needed: u64 = layer_bytes[first_remote..].iter().sum();
            let unreachable =
                if down.is_empty() { String::new() } else { format!("; left out: {}", down.join("; ")) };
            return Err(Error::Rpc(format!(
                "{n_remote} layers ({} MiB of weights, with room for their KV cache) do not fit \
                 on the peers: they offer {} MiB ({}){unreachable}",
                needed >> 20,
                free.iter().sum::<u64>() >> 20,
                devices
                    .iter()
                    .zip(&free)
                    .map(|(d, free)| format!("{} {}: {} MiB", d.endpoint, d.name, free >> 20))
                    .collect::<Vec<_>>()
                    .join(", ")
            )));
        }
        used += need;
        layers[il] = Some(on);
    }
    let remote_bytes = layer_bytes[first_remote..].iter().sum();
    let mut placement: Vec<LayerPlacement> = Vec::new();
    for (il, on) in layers.iter().enumerate() {
        match placement.last_mut() {
            Some(run) if run_device(run, *on, &devices, here) => {
                run.n_layers += 1;
                run.weight_bytes += layer_bytes[il];
            }
            _ => placement.push(LayerPlacement {
                device: on.map_or_else(|| here.to_owned(), |d| devices[d].name.clone()),
                peer: on.map(|d| devices[d].endpoint.clone()),
                first_layer: il,
                n_layers: 1,
                weight_bytes: layer_bytes[il],
                round_trip_us: on.and_then(|d| round_trips[d]).map(|t| t.as_micros() as u64),
            }),
        }
    }
    tracing::info!(
        layers = n_remote,
        of = n_layer,
        peers = %options.peers.join(" "),
        bytes = remote_bytes,
        "layers {first_remote}..{} on peers",
        n_layer
    );
    Ok(Some(SplitPlan { remote: Remote { devices, layers }, remote_bytes, placement }))
}

/// Whether `run` is on the device `on` names (None: this machine's, `here`).
fn run_device(run: &LayerPlacement, on: Option<usize>, devices: &[RemoteDevice], here: &str) -> bool {
    match on {
        None => run.peer.is_none() && run.device == here,
        Some(d) => run.peer.as_deref() == Some(devices[d].endpoint.as_str()) && run.device == devices[d].name,
    }
}

/// The layers of `f` as its metadata counts them (`{architecture}.block_count`), for a file
/// our graph does not build.
pub(crate) fn n_layer(f: &GgufFile) -> Result<usize> {
    let arch = f.get_str("general.architecture").unwrap_or_default();
    f.get_u64(&format!("{arch}.block_count")).map(|n| n as usize).ok_or_else(|| Error::BadModel {
        path: f.path().to_owned(),
        reason: format!("no {arch}.block_count: cannot place its layers on peers"),
    })
}

/// Bytes of each layer's tensors in `f` (named `blk.N.…`).
fn layer_bytes(f: &GgufFile, n_layer: usize) -> Vec<u64> {
    let mut bytes = vec![0u64; n_layer];
    for name in f.tensor_names() {
        let layer = name.strip_prefix("blk.").and_then(|rest| rest.split('.').next()?.parse::<usize>().ok());
        if let Some(il) = layer.filter(|&il| il < n_layer) {
            bytes[il] += f.tensor_bytes(&name).map_or(0, |b| b.len() as u64);
        }
    }
    bytes
}

/// Bytes of all of `f`'s tensors.
fn file_bytes(f: &GgufFile) -> u64 {
    f.tensor_names().iter().map(|name| f.tensor_bytes(name).map_or(0, |b| b.len() as u64)).sum()
}
