//! Where Vulkan comes from: the loader (`libvulkan.so.1`) if the machine has one, else the
//! GPU driver's installable client driver (ICD) loaded directly, as the loader itself would.
//!
//! Containers that mount the NVIDIA driver with the `graphics` capability carry its ICD (the
//! manifest `/usr/share/vulkan/icd.d/nvidia_icd.json`, naming `libGLX_nvidia.so.0`) but often
//! no loader (and no X server, which the GLX library needs: [`library_candidates`]). The loader–ICD interface (Khronos `LoaderDriverInterface.md`) is small enough to
//! stand in for: read the manifests (`VK_DRIVER_FILES` or the older `VK_ICD_FILENAMES` if set,
//! else the standard directories), dlopen each manifest's `library_path` (a bare file name is
//! left to the dynamic linker's search, a relative path is taken from the manifest's folder),
//! agree on an interface version through `vk_icdNegotiateLoaderICDInterfaceVersion` where the
//! ICD exports it, and use `vk_icdGetInstanceProcAddr` as `vkGetInstanceProcAddr`. An ICD
//! answers it for global commands (null instance), instance commands and `vkGetDeviceProcAddr`,
//! which is all ash asks of it: `ash::Instance::load` takes instance commands from
//! `vkGetInstanceProcAddr(instance, …)` and `ash::Device::load` device commands from
//! `vkGetDeviceProcAddr`. Without a loader nothing rewrites the ICD's dispatchable handles,
//! which is fine: they go back only to the ICD that made them.

use std::ffi::c_char;
use std::path::{Path, PathBuf};

use ash::vk;

/// The manifest folders the loader searches on Linux without an override, in its order
/// (`$XDG_CONFIG_DIRS`, `/etc`, `$XDG_DATA_DIRS` with their defaults).
pub const MANIFEST_DIRS: [&str; 4] = [
    "/etc/xdg/vulkan/icd.d",
    "/etc/vulkan/icd.d",
    "/usr/local/share/vulkan/icd.d",
    "/usr/share/vulkan/icd.d",
];

/// The loader–ICD interface version offered: 5 lets the application ask for any API version
/// (the ICD reports what it supports) and needs nothing from the loader that cbf does not do.
const INTERFACE_VERSION: u32 = 5;

/// An ICD manifest's `ICD` object.
#[derive(Debug, Clone, PartialEq, Eq, serde::Deserialize)]
pub struct IcdManifest {
    pub library_path: String,
    #[serde(default)]
    pub api_version: Option<String>,
}

#[derive(serde::Deserialize)]
struct ManifestFile {
    #[serde(rename = "ICD")]
    icd: IcdManifest,
}

/// Parse a manifest's text.
pub fn parse_manifest(text: &str) -> Result<IcdManifest, String> {
    serde_json::from_str::<ManifestFile>(text)
        .map(|m| m.icd)
        .map_err(|e| format!("not an ICD manifest: {e}"))
}

/// What to hand `dlopen` for a manifest at `manifest` naming `library_path`: a bare file name
/// as it is (the dynamic linker searches for it), an absolute path as it is, a relative path
/// from the manifest's folder.
pub fn library_for(manifest: &Path, library_path: &str) -> PathBuf {
    let lib = Path::new(library_path);
    if lib.is_absolute() || !library_path.contains('/') {
        lib.to_path_buf()
    } else {
        manifest.parent().unwrap_or(Path::new("")).join(lib)
    }
}

/// The libraries to try for a manifest's ICD, in order: the one it names, then, where that is
/// NVIDIA's GLX library, NVIDIA's EGL library beside it. Both carry the driver's Vulkan entry
/// points, but the GLX one initialises for an X server: on a headless machine (the lent H100)
/// its negotiation fails with ERROR_INITIALIZATION_FAILED (the dynamic linker logs
/// `libnvidia-glcore: undefined symbol: ErrorF`), while the EGL one negotiates and creates
/// instances (bench/device-probe-vulkan-2026-11-27-s13.txt). NVIDIA's headless installs name the
/// EGL library in the manifest themselves.
pub fn library_candidates(manifest: &Path, library_path: &str) -> Vec<PathBuf> {
    let named = library_for(manifest, library_path);
    let mut out = vec![named.clone()];
    if let Some(name) = named.file_name().and_then(|n| n.to_str()) {
        if let Some(rest) = name.strip_prefix("libGLX_nvidia.so") {
            out.push(named.with_file_name(format!("libEGL_nvidia.so{rest}")));
        }
    }
    out
}

/// The manifest files to try: those `override_list` names (the value of `VK_DRIVER_FILES` or
/// `VK_ICD_FILENAMES`, colon-separated files or folders) if given, else every `*.json` in
/// `dirs`; folders are read in name order. Also returns every place looked at, for the error
/// when nothing is found.
pub fn manifest_files(override_list: Option<&str>, dirs: &[&str]) -> (Vec<PathBuf>, Vec<String>) {
    let places: Vec<PathBuf> = match override_list {
        Some(list) => list
            .split(':')
            .filter(|s| !s.is_empty())
            .map(PathBuf::from)
            .collect(),
        None => dirs.iter().map(PathBuf::from).collect(),
    };
    let mut files = Vec::new();
    let mut tried = Vec::new();
    for place in places {
        tried.push(place.display().to_string());
        if place.is_dir() {
            let mut found: Vec<PathBuf> = std::fs::read_dir(&place)
                .into_iter()
                .flatten()
                .flatten()
                .map(|e| e.path())
                .filter(|p| p.extension().is_some_and(|x| x == "json"))
                .collect();
            found.sort();
            files.extend(found);
        } else if place.is_file() {
            files.push(place);
        }
    }
    (files, tried)
}

/// A Vulkan entry point and the library behind it, kept loaded as long as the entry is used.
pub struct VulkanLib {
    pub entry: ash::Entry,
    /// Where it came from (for messages): the loader, or an ICD's manifest.
    pub source: String,
    /// The ICD's library when there is no loader (`ash::Entry` keeps the loader's itself).
    _icd: Option<libloading::Library>,
}

type NegotiateFn = unsafe extern "system" fn(*mut u32) -> vk::Result;
type IcdGetInstanceProcAddr = vk::PFN_vkGetInstanceProcAddr;

/// The Vulkan implementations on this machine: the loader alone if there is one (it covers
/// every ICD), else each ICD that loads. An error lists every place tried.
pub fn vulkan_libs() -> Result<Vec<VulkanLib>, String> {
    // SAFETY: loads the system's Vulkan loader, whose initialisers are trusted as any library's.
    let loader_err = match unsafe { ash::Entry::load() } {
        Ok(entry) => {
            return Ok(vec![VulkanLib {
                entry,
                source: "the Vulkan loader (libvulkan.so.1)".into(),
                _icd: None,
            }])
        }
        Err(e) => e.to_string(),
    };
    let override_list = std::env::var("VK_DRIVER_FILES")
        .or_else(|_| std::env::var("VK_ICD_FILENAMES"))
        .ok();
    let (files, tried) = manifest_files(override_list.as_deref(), &MANIFEST_DIRS);
    let mut libs = Vec::new();
    let mut refused = Vec::new();
    for file in files {
        match load_icd(&file) {
            Ok(lib) => libs.push(lib),
            Err(e) => refused.push(format!("{}: {e}", file.display())),
        }
    }
    if libs.is_empty() {
        let refused = if refused.is_empty() {
            "no manifest found".to_string()
        } else {
            refused.join("; ")
        };
        return Err(format!(
            "no Vulkan loader (libvulkan.so.1: {loader_err}) and no usable Vulkan driver (ICD \
             manifests looked for in {}: {refused})",
            tried.join(", ")
        ));
    }
    Ok(libs)
}

/// Load the ICD of the manifest at `file`: the first of its [`library_candidates`] that
/// loads and negotiates; the error names each one tried and why it was refused.
fn load_icd(file: &Path) -> Result<VulkanLib, String> {
    let text = std::fs::read_to_string(file).map_err(|e| e.to_string())?;
    let manifest = parse_manifest(&text)?;
    let mut refused = Vec::new();
    for path in library_candidates(file, &manifest.library_path) {
        match load_library(&path) {
            Ok((entry, lib)) => {
                return Ok(VulkanLib {
                    entry,
                    source: format!(
                        "the Vulkan driver {} (manifest {})",
                        path.display(),
                        file.display()
                    ),
                    _icd: Some(lib),
                })
            }
            Err(e) => refused.push(format!("{}: {e}", path.display())),
        }
    }
    Err(refused.join("; "))
}

/// dlopen one ICD library, agree on the interface version and take its
/// `vk_icdGetInstanceProcAddr` as the entry's `vkGetInstanceProcAddr`.
fn load_library(path: &Path) -> Result<(ash::Entry, libloading::Library), String> {
    // SAFETY: loads the GPU driver's library named by its own manifest, as the loader would.
    let lib = unsafe { libloading::Library::new(path) }.map_err(|e| e.to_string())?;
    // SAFETY: the symbols' types are the loader–ICD interface's (LoaderDriverInterface.md).
    let gipa: IcdGetInstanceProcAddr = unsafe {
        if let Ok(negotiate) = lib.get::<NegotiateFn>(b"vk_icdNegotiateLoaderICDInterfaceVersion") {
            let mut version = INTERFACE_VERSION;
            let r = negotiate(&mut version);
            if r != vk::Result::SUCCESS {
                return Err(format!(
                    "refused loader interface version {INTERFACE_VERSION}: {r:?}"
                ));
            }
        }
        *lib.get::<IcdGetInstanceProcAddr>(b"vk_icdGetInstanceProcAddr")
            .map_err(|e| format!("no vk_icdGetInstanceProcAddr: {e}"))?
    };
    // SAFETY: `gipa` is the ICD's vkGetInstanceProcAddr (the loader's signature); `lib` is
    // returned beside the entry and kept with it, so it stays valid as long as the entry.
    let entry = unsafe {
        ash::Entry::from_static_fn(ash::StaticFn {
            get_instance_proc_addr: gipa,
        })
    };
    Ok((entry, lib))
}

/// A NUL-terminated fixed-size Vulkan string as text.
pub fn vk_str(raw: &[c_char]) -> String {
    let bytes: Vec<u8> = raw
        .iter()
        .take_while(|&&c| c != 0)
        .map(|&c| c as u8)
        .collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The manifest the NVIDIA driver 580 installs (`/usr/share/vulkan/icd.d/nvidia_icd.json`
    /// on the lent H100 machine, bench/device-probe-2026-11-27.txt).
    const NVIDIA: &str = r#"{
        "file_format_version" : "1.0.1",
        "ICD": {
            "library_path": "libGLX_nvidia.so.0",
            "api_version" : "1.4.312"
        }
    }"#;

    #[test]
    fn nvidia_manifest_names_its_library() {
        let m = parse_manifest(NVIDIA).unwrap();
        assert_eq!(m.library_path, "libGLX_nvidia.so.0");
        assert_eq!(m.api_version.as_deref(), Some("1.4.312"));
        let mesa = r#"{"ICD": {"library_path": "/usr/lib/x86_64-linux-gnu/libvulkan_lvp.so"}}"#;
        assert_eq!(parse_manifest(mesa).unwrap().api_version, None);
    }

    #[test]
    fn malformed_manifests_are_refused_with_a_reason() {
        for bad in [
            "",
            "{",
            r#"{"file_format_version": "1.0.0"}"#,
            r#"{"ICD": {}}"#,
        ] {
            let e = parse_manifest(bad).unwrap_err();
            assert!(e.starts_with("not an ICD manifest"), "{bad:?}: {e}");
        }
    }

    /// The loader's rule: a bare name goes to the dynamic linker, a relative path is taken
    /// from the manifest's folder, an absolute one as it is.
    #[test]
    fn library_paths_resolve_as_the_loader_resolves_them() {
        let m = Path::new("/opt/icd.d/x.json");
        assert_eq!(
            library_for(m, "libGLX_nvidia.so.0"),
            Path::new("libGLX_nvidia.so.0")
        );
        assert_eq!(
            library_for(m, "../lib/libx.so"),
            Path::new("/opt/icd.d/../lib/libx.so")
        );
        assert_eq!(
            library_for(m, "/usr/lib/libx.so"),
            Path::new("/usr/lib/libx.so")
        );
    }

    /// NVIDIA's GLX library is followed by its EGL library in the same place (the one that
    /// works headless); any other library is tried alone.
    #[test]
    fn nvidia_glx_falls_back_to_egl() {
        let m = Path::new("/usr/share/vulkan/icd.d/nvidia_icd.json");
        assert_eq!(
            library_candidates(m, "libGLX_nvidia.so.0"),
            [
                Path::new("libGLX_nvidia.so.0"),
                Path::new("libEGL_nvidia.so.0")
            ]
        );
        assert_eq!(
            library_candidates(m, "/usr/lib64/libGLX_nvidia.so.580.159.04"),
            [
                Path::new("/usr/lib64/libGLX_nvidia.so.580.159.04"),
                Path::new("/usr/lib64/libEGL_nvidia.so.580.159.04")
            ]
        );
        assert_eq!(
            library_candidates(m, "libEGL_nvidia.so.0"),
            [Path::new("libEGL_nvidia.so.0")]
        );
        assert_eq!(
            library_candidates(m, "../lib/libvulkan_lvp.so"),
            [Path::new("/usr/share/vulkan/icd.d/../lib/libvulkan_lvp.so")]
        );
    }

    /// Folders give their `*.json` files in name order; an override names files or folders;
    /// every place looked at is listed.
    #[test]
    fn manifests_are_found_in_folders_and_overrides() {
        let dir = std::env::temp_dir().join(format!("cbf-icd-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        for name in ["b.json", "a.json", "notes.txt"] {
            std::fs::write(dir.join(name), NVIDIA).unwrap();
        }
        let d = dir.to_str().unwrap();
        let (files, tried) = manifest_files(None, &[d, "/nonexistent/icd.d"]);
        assert_eq!(files, [dir.join("a.json"), dir.join("b.json")]);
        assert_eq!(tried, [d, "/nonexistent/icd.d"]);
        let list = format!("{}:/nonexistent/x.json", dir.join("b.json").display());
        let (files, tried) = manifest_files(Some(&list), &MANIFEST_DIRS);
        assert_eq!(files, [dir.join("b.json")]);
        assert_eq!(tried.len(), 2);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn fixed_size_strings_stop_at_their_nul() {
        let mut raw = [0 as c_char; 8];
        for (r, b) in raw.iter_mut().zip(b"H100") {
            *r = *b as c_char;
        }
        assert_eq!(vk_str(&raw), "H100");
        assert_eq!(vk_str(&[0; 4]), "");
    }
}
