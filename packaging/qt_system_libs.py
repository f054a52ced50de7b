"""The system libraries Qt's xcb platform plugin loads, checked before `make run` spends minutes on the venv.

Qt aborts at start when one is missing and names only the first ("could not load the Qt platform plugin xcb");
this names them all, installs them with apt-get where it may (root, or sudo without a password), and otherwise
prints the one command that does. Standard library only: it runs on the system's python3, before the venv.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

# soname → Debian/Ubuntu package: the NEEDED entries of PySide6's libqxcb.so, libQt6XcbQpa.so and libQt6Gui.so
# that do not come with python3 itself (libc, libstdc++, zlib) or inside PySide6 (Qt, ICU); tests hold it to them.
REQUIRED = (
    ("libxcb.so.1", "libxcb1"),
    ("libX11.so.6", "libx11-6"),
    ("libxcb-render.so.0", "libxcb-render0"),
    ("libxcb-shm.so.0", "libxcb-shm0"),
    ("libxcb-sync.so.1", "libxcb-sync1"),
    ("libxcb-xfixes.so.0", "libxcb-xfixes0"),
    ("libxcb-util.so.1", "libxcb-util1"),
    ("libxkbcommon.so.0", "libxkbcommon0"),
    ("libfreetype.so.6", "libfreetype6"),
    ("libglib-2.0.so.0", "libglib2.0-0"),
    ("libgthread-2.0.so.0", "libglib2.0-0"),
    ("libxcb-cursor.so.0", "libxcb-cursor0"),
    ("libxcb-icccm.so.4", "libxcb-icccm4"),
    ("libxcb-keysyms.so.1", "libxcb-keysyms1"),
    ("libxcb-image.so.0", "libxcb-image0"),
    ("libxcb-render-util.so.0", "libxcb-render-util0"),
    ("libxcb-randr.so.0", "libxcb-randr0"),
    ("libxcb-shape.so.0", "libxcb-shape0"),
    ("libxcb-xkb.so.1", "libxcb-xkb1"),
    ("libxkbcommon-x11.so.0", "libxkbcommon-x11-0"),
    ("libX11-xcb.so.1", "libx11-xcb1"),
    ("libEGL.so.1", "libegl1"),
    ("libGL.so.1", "libgl1"),
    ("libfontconfig.so.1", "libfontconfig1"),
    ("libdbus-1.so.3", "libdbus-1-3"),
)


def needs_check(platform: str, env: dict[str, str]) -> bool:
    """Only Linux runs the xcb plugin, and not when another Qt platform (offscreen, wayland, …) is asked for."""
    if not platform.startswith("linux"):
        return False
    qpa = env.get("QT_QPA_PLATFORM", "").strip()
    return not qpa or qpa.split(":")[0].split(";")[0] == "xcb"


def missing_packages(ldconfig_listing: str) -> list[str]:
    """Packages whose library `ldconfig -p` does not list."""
    have = {line.split()[0] for line in ldconfig_listing.splitlines()[1:] if line.strip()}
    return list(dict.fromkeys(pkg for soname, pkg in REQUIRED if soname not in have))


def _ldconfig_listing() -> str | None:
    exe = shutil.which("ldconfig") or next((p for p in ("/sbin/ldconfig", "/usr/sbin/ldconfig")
                                             if os.path.exists(p)), None)
    if exe is None:
        return None
    try:
        return subprocess.run([exe, "-p"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return None


def _install_prefix() -> list[str] | None:
    """How this user may run apt-get: directly as root, through sudo without a password, or not at all."""
    if shutil.which("apt-get") is None:
        return None
    if os.geteuid() == 0:
        return []
    sudo_ok = shutil.which("sudo") and subprocess.run(["sudo", "-n", "true"], check=False,
                                                      capture_output=True).returncode == 0
    if sudo_ok:
        return ["sudo", "-n"]
    return None


def main() -> int:
    if not needs_check(sys.platform, dict(os.environ)):
        return 0
    listing = _ldconfig_listing()
    if listing is None:
        print("qt_system_libs: ldconfig is not available; not checking Qt's xcb libraries.", file=sys.stderr)
        return 0
    pkgs = missing_packages(listing)
    if not pkgs:
        return 0
    command = "sudo apt-get install -y " + " ".join(pkgs)
    prefix = _install_prefix()
    if prefix is None:
        where = ("Install them with:\n    " + command if shutil.which("apt-get")
                 else "Install the packages that provide them with your distribution's package manager.")
        print(f"The desktop app needs system libraries that are missing: {', '.join(pkgs)}.\n{where}\n"
              "(or run headless: QT_QPA_PLATFORM=offscreen make run)", file=sys.stderr)
        return 1
    print(f"Installing the libraries Qt's xcb plugin needs: {' '.join(pkgs)}", file=sys.stderr)
    apt = [*prefix, "apt-get", "install", "-y", "--no-install-recommends", *pkgs]
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    if subprocess.run(apt, check=False, env=env).returncode != 0:
        # A fresh container has no package lists yet.
        subprocess.run([*prefix, "apt-get", "update"], check=False, env=env)
        if subprocess.run(apt, check=False, env=env).returncode != 0:
            print(f"Installing failed; run:\n    {command}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
