#!/usr/bin/env python3
"""Render katgpucbf's XB-engine beamformer kernel to plain CUDA, for the peer harness.

Runs on a CPU host (no GPU). Needs Python 3.9+ and Mako; nothing of katgpucbf or katsdpsigproc is
imported. Their sources are read from local bare git mirrors (as the session's ``fetch`` tool
leaves them); nothing of theirs is kept in cbf's repository.

What it does:

1. resolves the katgpucbf commit (``--rev``, default HEAD of the mirror) and extracts
   ``src/katgpucbf`` at that commit, and ``src/katsdpsigproc`` from the katsdpsigproc mirror,
   into a temporary folder;
2. checks that ``xbgpu/beamform.py`` still has the launch formulas this script ports
   (``block_spectra = min(128, n_spectra_per_batch)``, the argument list, the global and local
   sizes); it stops if they changed (``--force`` renders anyway);
3. renders ``kernels/beamform.mako`` the way ``BeamformTemplate`` does: a Mako ``TemplateLookup``
   over [xbgpu package, katgpucbf package, katsdpsigproc package] (the ``extra_dirs`` that
   ``BeamformTemplate`` passes to ``katsdpsigproc.accel.build``, which appends katsdpsigproc's
   own folder), ``strict_undefined``, a ``#line N "file"`` directive before every template line
   (what katsdpsigproc's ``LinenoLexer`` does), and the context
   ``simd_group_size=32, block_spectra, beams, dither_enabled, DitherType``; it renders
   ``kernels/curand_init.mako`` (``RandomStateBuilder``) the same way;
4. wraps each rendering in ``extern "C" { ... }`` as PyCUDA's ``SourceModule`` does before
   running nvcc, and writes ``<out>/*.cu``;
5. writes ``<out>/manifest.json``: commits, template contexts, kernel names, argument order,
   and for every timed case the grid, block and scalar arguments that ``Beamform._run`` would
   pass (exact, unpadded slot shapes, as ``Beamform.ensure_all_bound`` allocates them);
6. copies ``bench.py``, ``run.sh`` and ``README.md`` from this folder, and katgpucbf's and
   katsdpsigproc's LICENSE files, into ``<out>`` (``--no-copy-bench`` skips the first three).

Usage (from cbf's repository root)::

    .venv/bin/pip install mako
    .venv/bin/python bench/peers/katgpucbf_beamform/render.py --out .dev-s23/peer-bf

The ``#line`` paths are shortened to ``katgpucbf-<commit7>/src/...`` and
``katsdpsigproc-<tag>/src/...``; re-rendering gives byte-identical files.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

import mako
import mako.lexer
from mako.lookup import TemplateLookup

HERE = Path(__file__).resolve().parent
DEFAULT_KATGPUCBF_GIT = "/work/.mirror/ska-sa+katgpucbf/repo"
DEFAULT_SIGPROC_GIT = "/work/.mirror/ska-sa+katsdpsigproc/repo"
WARP_SIZE = 32  # katsdpsigproc passes simd_group_size=device.warp_size to every template
RAND_WGS = 256  # RandomStateBuilder.make_states: local size 256

# The timed cases. Each is (name, n_ants, channels, spectra_per_batch, batches, beams, dither).
# Beam b uses input polarisation b % 2 (as katgpucbf's scratch/xbgpu/benchmarks/beamform_bench.py
# builds its single-pol beams); "dither" is DitherType.UNIFORM (katgpucbf's default) on every beam,
# or NONE on every beam.
CASES = []
for _d in (False, True):
    _t = "dither" if _d else "nodither"
    CASES += [
        (f"a80_s256x4_b8_{_t}", 80, 512, 256, 4, 8, _d),
        (f"a80_s32x32_b8_{_t}", 80, 512, 32, 32, 8, _d),
        (f"a80_s256x4_b64_{_t}", 80, 512, 256, 4, 64, _d),
        (f"a80_s256x4_b128_{_t}", 80, 512, 256, 4, 128, _d),
        (f"a80_s256x4_b256_{_t}", 80, 512, 256, 4, 256, _d),
        (f"a256_s256x2_b8_{_t}", 256, 512, 256, 2, 8, _d),
    ]

# Text that must be present in xbgpu/beamform.py for the ported formulas below to hold.
BEAMFORM_PY_EXPECT = [
    "self.block_spectra = min(128, n_spectra_per_batch)",
    '"kernels/beamform.mako"',
    '"block_spectra": self.block_spectra,',
    '"beams": beams,',
    '"dither_enabled": self._dither_enabled,',
    '"DitherType": DitherType,',
    "extra_dirs=[str(resource_dir), str(resource_dir.parent)],",
    'self.kernel = program.get_kernel("beamform")',
    "(n_batches, n_ants, n_channels_per_substream, n_spectra_per_batch, pol_dim, complex_dim), np.int8",
    "(n_batches, n_beams, n_channels_per_substream, n_spectra_per_batch, complex_dim), np.int8",
    'self.slots["saturated"] = accel.IOSlot((n_beams,), np.uint32)',
    "weights_dims = (n_ants, accel.Dimension(n_beams, exact=True))",
    'self.slots["weights"] = accel.IOSlot(weights_dims, np.complex64)',
    'self.slots["delays"] = accel.IOSlot(weights_dims, np.float32)',
    "(n_batches, n_channels_per_substream, n_spectra_per_batch),",
    "out_buffer.buffer,",
    'self.buffer("saturated").buffer,',
    "in_buffer.buffer,",
    'self.buffer("weights").buffer,',
    'self.buffer("delays").buffer,',
    '+ ([self.buffer("rand_states").buffer] if self.template._dither_enabled else [])',
    "np.int32(out_buffer.padded_shape[3]),",
    "np.int32(out_buffer.padded_shape[2] * out_buffer.padded_shape[3]),",
    "np.int32(out_buffer.padded_shape[1] * out_buffer.padded_shape[2] * out_buffer.padded_shape[3]),",
    "np.int32(in_buffer.padded_shape[3]),",
    "np.int32(in_buffer.padded_shape[2] * in_buffer.padded_shape[3]),",
    "np.int32(in_buffer.padded_shape[1] * in_buffer.padded_shape[2] * in_buffer.padded_shape[3]),",
    "np.int32(in_buffer.shape[1]),",
    "np.int32(in_buffer.shape[3]),",
    "accel.roundup(in_buffer.shape[3], self.template.block_spectra),",
    "in_buffer.shape[2],",
    "in_buffer.shape[0],",
    "local_size=(self.template.block_spectra, 1, 1),",
]
ENGINE_PY_EXPECT = [
    "n_spectra_per_batch=engine.recv_layout.n_spectra_per_heap,",
    "n_batches=engine.heaps_per_fengine_per_chunk,",
    "sequence_first=engine.channel_offset_value,",
    "sequence_step=engine.n_channels,",
]
KERNEL_ARGS = [
    ("out", "char2* (int8 [batch][beam][channel][spectrum][re,im])"),
    ("out_saturated", "uint32* [beam] (incremented)"),
    ("in", "const char4* (int8 [batch][antenna][channel][spectrum][pol][re,im])"),
    ("weights", "const float2* [antenna][beam]"),
    ("delays", "const float* [antenna][beam]"),
    ("rand_states", "randState_t* [batch][channel][spectrum] (24 B each; only when dither_enabled)"),
    ("out_stride", "int32 = spectra"),
    ("out_beam_stride", "int32 = channels*spectra"),
    ("out_batch_stride", "int32 = beams*channels*spectra"),
    ("in_stride", "int32 = spectra"),
    ("in_antenna_stride", "int32 = channels*spectra"),
    ("in_batch_stride", "int32 = ants*channels*spectra"),
    ("n_ants", "int32"),
    ("n_spectra", "int32"),
]


def git(git_dir: str, *args: str, binary: bool = False):
    p = subprocess.run(["git", f"--git-dir={git_dir}", *args], capture_output=True, check=True)
    return p.stdout if binary else p.stdout.decode().strip()


def extract(git_dir: str, commit: str, path: str, dest: Path) -> None:
    data = git(git_dir, "archive", "--format=tar", commit, path, binary=True)
    with tarfile.open(fileobj=io.BytesIO(data)) as tf:
        for m in tf.getmembers():
            if not (m.isfile() or m.isdir()):
                continue
            target = (dest / m.name).resolve()
            if not str(target).startswith(str(dest.resolve())):
                raise RuntimeError(f"unsafe path in archive: {m.name}")
            if m.isdir():
                target.mkdir(parents=True, exist_ok=True)
            else:
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(tf.extractfile(m).read())


class LineLexer(mako.lexer.Lexer):
    """Put ``#line N "file"`` before every template line (as katsdpsigproc's ``LinenoLexer``)."""

    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        self.preprocessor.insert(0, self._number_lines)

    def _number_lines(self, source: str) -> str:
        name = self.filename if self.filename is not None else "<string>"
        quoted = '"' + re.sub(r'([\\"])', r"\\\1", name) + '"'
        lines = source.split("\n")
        if lines and lines[-1] == "":
            lines.pop()
        return "".join(f"#line {i + 1} {quoted}\n{line}\n" for i, line in enumerate(lines))


class Beam:
    """Stand-in for katgpucbf.xbgpu.beamform.Beam (the template reads .pol and .dither)."""

    def __init__(self, pol: int, dither):
        assert pol in (0, 1)
        self.pol = pol
        self.dither = dither


def make_dither_type(utils_py: str):
    """Build a DitherType enum with the values katgpucbf's utils.py gives (NONE falsey)."""
    import enum

    block = re.search(r"class DitherType\(enum\.Enum\):(.*?)\n\n\n", utils_py, re.S)
    if not block:
        raise RuntimeError("DitherType not found in katgpucbf/utils.py")
    vals = dict(re.findall(r"^\s+(\w+) = (\d+)", block.group(1), re.M))
    assert vals.get("NONE") == "0" and vals.get("UNIFORM") == "1" and vals.get("DEFAULT") == "1", vals
    return enum.Enum("DitherType", [("NONE", 0), ("UNIFORM", 1), ("DEFAULT", 1)]), vals


def divup(a: int, b: int) -> int:
    return -(-a // b)


def case_geometry(n_ants, channels, spectra, batches, n_beams, dither) -> dict:
    """Port of BeamformTemplate/Beamform (exact, unpadded slot shapes)."""
    block_spectra = min(128, spectra)
    global_size = (divup(spectra, block_spectra) * block_spectra, channels, batches)
    local_size = (block_spectra, 1, 1)
    grid = tuple(g // loc for g, loc in zip(global_size, local_size))
    scalars = {
        "out_stride": spectra,
        "out_beam_stride": channels * spectra,
        "out_batch_stride": n_beams * channels * spectra,
        "in_stride": spectra,
        "in_antenna_stride": channels * spectra,
        "in_batch_stride": n_ants * channels * spectra,
        "n_ants": n_ants,
        "n_spectra": spectra,
    }
    for k, v in scalars.items():
        assert v < 2**31, (k, v)
    n_states = batches * channels * spectra
    return dict(
        block_spectra=block_spectra,
        batch_beams=min(16, n_beams),
        grid=list(grid),
        block=list(local_size),
        global_size=list(global_size),
        scalars=scalars,
        in_shape=[batches, n_ants, channels, spectra, 2, 2],
        out_shape=[batches, n_beams, channels, spectra, 2],
        weights_shape=[n_ants, n_beams],
        rand_states_shape=[batches, channels, spectra] if dither else None,
        rand_state_init=(
            dict(grid=[divup(n_states, RAND_WGS), 1, 1], block=[RAND_WGS, 1, 1], n=n_states) if dither else None
        ),
    )


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True, help="output folder (e.g. .dev-s23/peer-bf)")
    p.add_argument("--katgpucbf-git", default=DEFAULT_KATGPUCBF_GIT, help="katgpucbf git dir [%(default)s]")
    p.add_argument("--katsdpsigproc-git", default=DEFAULT_SIGPROC_GIT, help="katsdpsigproc git dir [%(default)s]")
    p.add_argument("--rev", default="HEAD", help="katgpucbf revision [%(default)s]")
    p.add_argument("--sigproc-rev", default="HEAD", help="katsdpsigproc revision [%(default)s]")
    p.add_argument("--keep-paths", action="store_true", help="keep the temporary paths in #line directives")
    p.add_argument("--force", action="store_true", help="render even if beamform.py's formulas changed")
    p.add_argument("--no-copy-bench", action="store_true", help="do not copy bench.py/run.sh/README.md")
    args = p.parse_args(argv)

    commit = git(args.katgpucbf_git, "rev-parse", f"{args.rev}^{{commit}}")
    commit_date = git(args.katgpucbf_git, "show", "-s", "--format=%cI", commit)
    commit_subject = git(args.katgpucbf_git, "show", "-s", "--format=%s", commit)
    sp_commit = git(args.katsdpsigproc_git, "rev-parse", f"{args.sigproc_rev}^{{commit}}")
    try:
        sp_tag = git(args.katsdpsigproc_git, "describe", "--tags", "--always", sp_commit)
    except subprocess.CalledProcessError:
        sp_tag = sp_commit[:7]
    short = commit[:7]

    out_dir = Path(args.out).resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="kbf_render_") as tmp:
        tmp = Path(tmp)
        kroot, sroot = tmp / "katgpucbf", tmp / "katsdpsigproc"
        extract(args.katgpucbf_git, commit, "src/katgpucbf", kroot)
        extract(args.katsdpsigproc_git, sp_commit, "src/katsdpsigproc", sroot)
        kpkg = kroot / "src" / "katgpucbf"
        xbgpu = kpkg / "xbgpu"
        sigpkg = sroot / "src" / "katsdpsigproc"

        beamform_py = (xbgpu / "beamform.py").read_text()
        engine_py = (xbgpu / "engine.py").read_text()
        missing = [s for s in BEAMFORM_PY_EXPECT if s not in beamform_py]
        missing += [s for s in ENGINE_PY_EXPECT if s not in engine_py]
        if missing:
            msg = "katgpucbf's beamform.py/engine.py changed; review the ported formulas:\n  " + "\n  ".join(missing)
            if not args.force:
                print(msg, file=sys.stderr)
                return 2
            print("WARNING: " + msg, file=sys.stderr)
        DitherType, dither_vals = make_dither_type((kpkg / "utils.py").read_text())
        init_py = (kpkg / "__init__.py").read_text()
        jpb = re.search(r"^DEFAULT_JONES_PER_BATCH: Final = 2\*\*(\d+)$", init_py, re.M)
        main_py = (xbgpu / "main.py").read_text()
        hpfc = re.search(r'"--heaps-per-fengine-per-chunk",\s*type=int,\s*default=(\d+),', main_py)

        def clean(text: str) -> str:
            if args.keep_paths:
                return text
            text = text.replace(str(kroot) + "/", f"katgpucbf-{short}/")
            return text.replace(str(sroot) + "/", f"katsdpsigproc-{sp_tag}/")

        def render(dirs, name, kws):
            lookup = TemplateLookup([str(d) for d in dirs], lexer_cls=LineLexer, strict_undefined=True)
            return lookup.get_template(name).render(simd_group_size=WARP_SIZE, **kws)

        manifest = {
            "katgpucbf_commit": commit,
            "katgpucbf_commit_date": commit_date,
            "katgpucbf_commit_subject": commit_subject,
            "katsdpsigproc_commit": sp_commit,
            "katsdpsigproc_describe": sp_tag,
            "mako_version": mako.__version__,
            "simd_group_size": WARP_SIZE,
            "wrapping": 'extern "C" {\\n<rendered>\\n} (as PyCUDA SourceModule, no_extern_c=False)',
            "katsdpsigproc_nvcc_flags": ["-lineinfo"],
            "line_paths_shortened": not args.keep_paths,
            "beamform_py_sha256": hashlib.sha256(beamform_py.encode()).hexdigest(),
            "beamform_mako_sha256": hashlib.sha256((xbgpu / "kernels" / "beamform.mako").read_bytes()).hexdigest(),
            "dither_type_values": dither_vals,
            "xbgpu_defaults": {
                "jones_per_batch": 2 ** int(jpb.group(1)) if jpb else None,
                "heaps_per_fengine_per_chunk": int(hpfc.group(1)) if hpfc else None,
                "note": "n_spectra_per_batch = jones_per_batch // channels (n_spectra_per_heap); "
                "n_batches = heaps_per_fengine_per_chunk",
            },
            "kernel_args": KERNEL_ARGS,
            "beam_pols": "beam b uses input pol b % 2",
            "files": {},
            "cases": {},
            "case_order": [c[0] for c in CASES],
        }

        def emit(fname: str, rendered: str, kernel: str, template: str, ctx: dict) -> None:
            body = clean(rendered)
            header = (
                f"// {fname}: katgpucbf kernel '{kernel}' rendered to plain CUDA by cbf's\n"
                f"// bench/peers/katgpucbf_beamform/render.py (for measurement only; not part of cbf).\n"
                f"// Source: ska-sa/katgpucbf commit {commit} ({template}),\n"
                f"// with katsdpsigproc {sp_tag} ({sp_commit[:7]}) port.mako; Mako {mako.__version__}.\n"
                f"// Template context: {json.dumps(ctx, sort_keys=True)}\n"
                "// Copyright (c) National Research Foundation (SARAO). BSD 3-Clause License:\n"
                "// see LICENSE.katgpucbf and LICENSE.katsdpsigproc in this folder.\n"
                "// Wrapped in extern \"C\" as PyCUDA's SourceModule does before running nvcc.\n"
            )
            text = header + 'extern "C" {\n' + body + "\n}\n"
            (out_dir / fname).write_text(text)
            manifest["files"][fname] = {
                "kernel": kernel,
                "template": template,
                "context": ctx,
                "sha256_file": hashlib.sha256(text.encode()).hexdigest(),
                "sha256_rendered_without_line_directives": hashlib.sha256(
                    "\n".join(ln for ln in rendered.split("\n") if not ln.startswith("#line ")).encode()
                ).hexdigest(),
                "lines": text.count("\n"),
            }
            print(f"wrote {out_dir / fname}: {text.count(chr(10))} lines, context {json.dumps(ctx)}")

        variants = {}
        for name, n_ants, channels, spectra, batches, n_beams, dither in CASES:
            geo = case_geometry(n_ants, channels, spectra, batches, n_beams, dither)
            tag = "dither" if dither else "nodither"
            fname = f"beamform_b{n_beams}_s{geo['block_spectra']}_{tag}.cu"
            if fname not in variants:
                dt = DitherType.UNIFORM if dither else DitherType.NONE
                beams = [Beam(pol=b % 2, dither=dt) for b in range(n_beams)]
                kws = {
                    "block_spectra": geo["block_spectra"],
                    "beams": beams,
                    "dither_enabled": any(b.dither != DitherType.NONE for b in beams),
                    "DitherType": DitherType,
                }
                src = render([xbgpu, kpkg, sigpkg], "kernels/beamform.mako", kws)
                ctx = {
                    "block_spectra": geo["block_spectra"],
                    "beams": f"{n_beams} x Beam(pol=b % 2, dither={dt.name})",
                    "dither_enabled": kws["dither_enabled"],
                    "simd_group_size": WARP_SIZE,
                    "derived_in_template": {"N_BEAMS": n_beams, "BATCH_BEAMS": min(16, n_beams),
                                            "BATCH_ANTENNAS": 16},
                }
                emit(fname, src, "beamform", "xbgpu/kernels/beamform.mako", ctx)
                manifest["files"][fname].update(n_beams=n_beams, block_spectra=geo["block_spectra"], dither=dither,
                                                beam_pols=[b % 2 for b in range(n_beams)])
                variants[fname] = True
            manifest["cases"][name] = dict(
                file=fname, n_ants=n_ants, channels=channels, spectra_per_batch=spectra, batches=batches,
                n_beams=n_beams, dither=dither, **geo,
            )

        src = render([kpkg, sigpkg], "kernels/curand_init.mako", {})
        emit("rand_state_init.cu", src, "rand_state_init", "kernels/curand_init.mako", {})
        manifest["files"]["rand_state_init.cu"]["args"] = (
            "randState_t *out, u64 seed, u64 sequence_first, u64 sequence_step, u64 offset, u32 n; "
            "grid ceil(n/256), block 256"
        )

        (out_dir / "LICENSE.katgpucbf").write_bytes(git(args.katgpucbf_git, "show", f"{commit}:LICENSE", binary=True))
        try:
            lic = git(args.katsdpsigproc_git, "show", f"{sp_commit}:LICENSE", binary=True)
        except subprocess.CalledProcessError:
            lic = git(args.katsdpsigproc_git, "show", f"{sp_commit}:LICENSE.txt", binary=True)
        (out_dir / "LICENSE.katsdpsigproc").write_bytes(lic)

    (out_dir / "manifest.json").write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    print(f"wrote {out_dir / 'manifest.json'} ({len(manifest['cases'])} cases, katgpucbf {commit})")
    if not args.no_copy_bench:
        for f in ("bench.py", "run.sh", "README.md"):
            shutil.copy2(HERE / f, out_dir / f)
        print(f"copied bench.py, run.sh, README.md into {out_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
