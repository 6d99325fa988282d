//! katgpucbf's ibverbs flags (fgpu/xbgpu `add_recv_arguments`/`add_send_arguments`, dsim's
//! unprefixed ones), turned into the engines' transport choices. Their meanings are
//! katgpucbf's: `--recv-ibv`/`--send-ibv` (`--ibv` in dsim) switch to ibverbs; a completion
//! vector ≥ 0 puts the queue's interrupts on that vector, a negative one polls; default 0.
//! `--recv-comp-vector` is a list (fgpu's), dealt to the receive threads in turn.
//! `--recv-ibv-mprq` is cbf's own: whether the receive queue is a striding (multi-packet) one
//! (`auto`, the default: where the device has one, as spead2 chooses), so that an operator can
//! demand it (`on`: a device without one is refused) or turn it off (`off`: one slot per
//! frame, every verbs NIC's way). A completion vector or queue choice without its ibverbs
//! switch is refused rather than ignored.
//!
//! Whether ibverbs is there is decided when the transports open (`engine::recv`,
//! `engine::send`): a build without the `ibv` feature, or a host without an RDMA device,
//! refuses the flag there, by name.

use clap::Args;

use super::CliError;
use crate::engine::recv::{IbvMprq, RecvTransport};
use crate::engine::send::SendTransport;

/// The engines' (fengine, xbengine) ibverbs flags.
#[derive(Debug, Clone, Default, Args)]
pub struct IbvFlags {
    /// Receive with ibverbs (the same as --recv-transport ibv; needs a build with
    /// `--features ibv`, an RDMA NIC and --recv-interface).
    #[arg(long)]
    pub recv_ibv: bool,
    /// Completion vector(s) of the ibverbs receive queues, comma-separated, dealt to the
    /// receive threads in turn; -1 = polling [default: 0].
    #[arg(long, value_delimiter = ',', allow_hyphen_values = true)]
    pub recv_comp_vector: Vec<i32>,
    /// The ibverbs receive queue: a striding (multi-packet) one where the device has it
    /// (auto), demanded (on: refused on a device without one), or one slot per frame (off)
    /// [default: auto].
    #[arg(long, value_enum)]
    pub recv_ibv_mprq: Option<IbvMprq>,
    /// Send with ibverbs (needs a build with `--features ibv`, an RDMA NIC,
    /// --send-interface, and multicast destinations).
    #[arg(long)]
    pub send_ibv: bool,
    /// Completion vector of the ibverbs send queues; -1 = polling [default: 0].
    #[arg(long, allow_hyphen_values = true)]
    pub send_comp_vector: Option<i32>,
}

impl IbvFlags {
    /// The receive transport, from `--recv-transport` and `--recv-ibv` together, the
    /// completion vectors and the receive queue choice.
    pub fn recv(
        &self,
        transport: RecvTransport,
    ) -> Result<(RecvTransport, Vec<i32>, IbvMprq), CliError> {
        let transport = match (self.recv_ibv, transport) {
            (false, t) => t,
            (true, RecvTransport::Udp | RecvTransport::Ibv) => RecvTransport::Ibv,
            (true, other) => {
                return Err(CliError::flag(
                    "--recv-ibv",
                    format!("conflicts with --recv-transport {other:?}").to_lowercase(),
                ))
            }
        };
        if transport != RecvTransport::Ibv && !self.recv_comp_vector.is_empty() {
            return Err(CliError::flag("--recv-comp-vector", "needs --recv-ibv"));
        }
        if transport != RecvTransport::Ibv && self.recv_ibv_mprq.is_some() {
            return Err(CliError::flag("--recv-ibv-mprq", "needs --recv-ibv"));
        }
        Ok((
            transport,
            self.recv_comp_vector.clone(),
            self.recv_ibv_mprq.unwrap_or_default(),
        ))
    }

    pub fn send(&self) -> Result<SendTransport, CliError> {
        send_transport(
            self.send_ibv,
            self.send_comp_vector,
            ("--send-ibv", "--send-comp-vector"),
        )
    }
}

/// dsim's ibverbs flags (katgpucbf dsim's send options carry no `send-` prefix).
#[derive(Debug, Clone, Default, Args)]
pub struct DsimIbvFlags {
    /// Send with ibverbs (needs a build with `--features ibv`, an RDMA NIC, --interface, and
    /// multicast destinations).
    #[arg(long)]
    pub ibv: bool,
    /// Completion vector of the ibverbs send queues; -1 = polling [default: 0].
    #[arg(long, allow_hyphen_values = true)]
    pub comp_vector: Option<i32>,
}

impl DsimIbvFlags {
    pub fn send(&self) -> Result<SendTransport, CliError> {
        send_transport(self.ibv, self.comp_vector, ("--ibv", "--comp-vector"))
    }
}

fn send_transport(
    ibv: bool,
    comp_vector: Option<i32>,
    (ibv_flag, vector_flag): (&'static str, &'static str),
) -> Result<SendTransport, CliError> {
    match (ibv, comp_vector) {
        (true, v) => Ok(SendTransport::Ibv {
            comp_vector: v.unwrap_or(0),
        }),
        (false, None) => Ok(SendTransport::Udp),
        (false, Some(_)) => Err(CliError::flag(vector_flag, format!("needs {ibv_flag}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_choose_transports_and_refuse_orphans() {
        let f = IbvFlags {
            recv_ibv: true,
            recv_comp_vector: vec![2, -1],
            recv_ibv_mprq: Some(IbvMprq::Off),
            send_ibv: true,
            send_comp_vector: Some(-1),
        };
        assert_eq!(
            f.recv(RecvTransport::Udp).unwrap(),
            (RecvTransport::Ibv, vec![2, -1], IbvMprq::Off)
        );
        assert_eq!(f.send().unwrap(), SendTransport::Ibv { comp_vector: -1 });
        let e = f.recv(RecvTransport::Uring).unwrap_err().to_string();
        assert!(e.contains("--recv-ibv") && e.contains("uring"), "{e}");
        let plain = IbvFlags::default();
        assert_eq!(
            plain.recv(RecvTransport::Ibv).unwrap(),
            (RecvTransport::Ibv, vec![], IbvMprq::Auto)
        );
        assert_eq!(plain.send().unwrap(), SendTransport::Udp);
        let orphan = IbvFlags {
            recv_comp_vector: vec![0],
            send_comp_vector: Some(3),
            ..Default::default()
        };
        assert!(orphan
            .recv(RecvTransport::Udp)
            .unwrap_err()
            .to_string()
            .contains("--recv-comp-vector"));
        let orphan_queue = IbvFlags {
            recv_ibv_mprq: Some(IbvMprq::On),
            ..Default::default()
        };
        let e = orphan_queue
            .recv(RecvTransport::Udp)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("--recv-ibv-mprq") && e.contains("--recv-ibv"),
            "{e}"
        );
        assert!(orphan
            .send()
            .unwrap_err()
            .to_string()
            .contains("--send-comp-vector"));
        let d = DsimIbvFlags {
            ibv: true,
            comp_vector: None,
        };
        assert_eq!(d.send().unwrap(), SendTransport::Ibv { comp_vector: 0 });
        let e = DsimIbvFlags {
            ibv: false,
            comp_vector: Some(1),
        }
        .send()
        .unwrap_err()
        .to_string();
        assert!(e.contains("--comp-vector") && e.contains("--ibv"), "{e}");
    }
}
