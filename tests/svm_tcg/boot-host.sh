#!/usr/bin/env bash
# Boots a software SVM+NPT KVM host and runs hvlab commands in it.
#
# The host is a Debian kernel under QEMU TCG (no acceleration) with an AMD CPU model that
# has SVM and NPT, so inside it kvm_amd loads with npt=1 and /dev/kvm is an ordinary TDP
# host: the flavour hvlab's users run, which these PVM machines are not. Exits are emulated
# there, so its times mean nothing; it is for correctness, counts and error paths.
#
#   boot-host.sh HVLAB KERNEL CMDS OUTDIR
#     HVLAB   the hvlab binary (dynamically linked is fine: its libraries are copied)
#     KERNEL  6.1 (bookworm's) | 6.12 (the newest in bookworm-security) | linux-image-VER-amd64
#     CMDS    one hvlab argument list per line; each runs with HVLAB_DB=/var/h.db
#     OUTDIR  receives N.out, N.err, N.rc per command, kernel.txt, and console.log
#
# Env: HVLAB_TCG_CACHE (kernels and tools; default: ~/.cache/hvlab-svm-tcg),
#      HVLAB_TCG_CMD_TIMEOUT (s per command, default 600), HVLAB_TCG_TIMEOUT (s, default 2400).
# Needs root for apt-get when packages are missing. Results leave the guest as a tar stream
# on its second serial port, so nothing is parsed out of the console.
set -euo pipefail

hvlab=$(readlink -f "${1:?usage: boot-host.sh HVLAB KERNEL CMDS OUTDIR}")
kernel=${2:?kernel: 6.1 or 6.12}
cmds=$(readlink -f "${3:?commands file}")
out=${4:?output directory}
cache=${HVLAB_TCG_CACHE:-$HOME/.cache/hvlab-svm-tcg}
cmd_timeout=${HVLAB_TCG_CMD_TIMEOUT:-600}
boot_timeout=${HVLAB_TCG_TIMEOUT:-2400}
mkdir -p "$cache" "$out"
out=$(readlink -f "$out")

say() { echo "boot-host: $*" >&2; }

# Tools: QEMU, a static busybox for the guest's userland, and what unpacks modules.
need=()
command -v qemu-system-x86_64 >/dev/null || need+=(qemu-system-x86)
[ -x /bin/busybox ] && /bin/busybox --list | grep -x insmod >/dev/null || need+=(busybox-static)
command -v cpio >/dev/null || need+=(cpio)
command -v xz >/dev/null || need+=(xz-utils)
command -v modinfo >/dev/null || need+=(kmod)
command -v zstd >/dev/null || need+=(zstd)
updated=
apt_update() { [ -n "$updated" ] || { apt-get update -qq; updated=1; }; }
if ((${#need[@]})); then
    say "installing ${need[*]}"
    apt_update
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >&2
fi

# The kernel package: its image, its config and the kvm modules.
resolve_image() {
    case "$kernel" in
        6.1) apt-cache depends linux-image-amd64 2>/dev/null ;;
        6.12) apt-cache depends linux-image-6.12-amd64 2>/dev/null ;;
        linux-image-*) echo "Depends: ${kernel%-unsigned}" ;;
        *) say "KERNEL must be 6.1, 6.12 or linux-image-VERSION-amd64"; exit 2 ;;
    esac | awk '/Depends: linux-image-/ { print $2; exit }'
}
image=$(resolve_image)
if [ -z "$image" ]; then
    apt_update
    image=$(resolve_image)
fi
[ -n "$image" ] || { say "no kernel package found for $kernel"; exit 2; }
unpacked="$cache/$image"
if [ ! -d "$unpacked/boot" ]; then
    say "fetching $image-unsigned"
    (cd "$cache" && rm -f "$image"-unsigned_*.deb && apt-get download -qq "$image-unsigned" 2>/dev/null ||
        { apt_update; apt-get download -qq "$image-unsigned"; })
    rm -rf "$unpacked.tmp"
    dpkg-deb -x "$cache/$image"-unsigned_*.deb "$unpacked.tmp"
    mv "$unpacked.tmp" "$unpacked"
fi
vmlinuz=$(ls "$unpacked"/boot/vmlinuz-*)
release=${vmlinuz##*/vmlinuz-}
moddir="$unpacked/lib/modules/$release"
say "kernel $release"

# The initramfs: busybox, kvm_amd and its dependencies in load order, hvlab and its libraries.
root=$(mktemp -d "${TMPDIR:-/tmp}/hvlab-tcg-root.XXXXXX")
trap 'rm -rf "$root"' EXIT
mkdir -p "$root"/{bin,dev,proc,sys,tmp,var/results,modules,boot,etc}
cp /bin/busybox "$root/bin/busybox"
for applet in $(/bin/busybox --list); do
    [ "$applet" = busybox ] || ln -s busybox "$root/bin/$applet"
done
loaded=" "
load_order=()
add_module() {
    local name=$1 file dep
    case "$loaded" in *" $name "*) return ;; esac
    loaded="$loaded$name "
    file=$(find "$moddir" \( -name "$name.ko*" -o -name "${name//_/-}.ko*" \) | head -n 1)
    [ -n "$file" ] || { say "module $name is not in $image"; exit 2; }
    for dep in $(modinfo -F depends "$file" | tr ',' ' '); do add_module "$dep"; done
    load_order+=("$file")
}
add_module kvm_amd
for file in "${load_order[@]}"; do
    base=$(basename "$file")
    case "$file" in
        *.ko.xz) xz -dc "$file" >"$root/modules/${base%.xz}"; base=${base%.xz} ;;
        *.ko.zst) zstd -dcq "$file" >"$root/modules/${base%.zst}"; base=${base%.zst} ;;
        *) cp "$file" "$root/modules/$base" ;;
    esac
    echo "$base" >>"$root/modules/order"
done
# The config where `hvlab host` reads HZ from.
cp "$unpacked/boot/config-$release" "$root/boot/config-$release"
cp "$hvlab" "$root/bin/hvlab"
for lib in $(ldd "$hvlab" | grep -o '/[^ ]*'); do
    mkdir -p "$root$(dirname "$lib")"
    cp -L "$lib" "$root$lib"
done
cp "$cmds" "$root/etc/cmds"

cat >"$root/init" <<EOF
#!/bin/sh
CMD_TIMEOUT=$cmd_timeout
EOF
cat >>"$root/init" <<'EOF'
export PATH=/bin HOME=/var HVLAB_DB=/var/h.db
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
r=/var/results
uname -r >$r/kernel.txt
for m in $(cat /modules/order); do
    case "$m" in kvm-amd.ko|kvm_amd.ko) args=npt=1 ;; *) args= ;; esac
    insmod "/modules/$m" $args 2>>$r/modules.err || echo "insmod $m failed" >>$r/modules.err
done
for p in npt nested; do cat /sys/module/kvm_amd/parameters/$p >$r/kvm_amd.$p 2>/dev/null; done
n=0
while IFS= read -r line; do
    [ -n "$line" ] || continue
    n=$((n + 1))
    echo "$line" >$r/$n.cmd
    echo "=== $n: hvlab $line" >/dev/console
    timeout -s KILL "$CMD_TIMEOUT" hvlab $line >$r/$n.out 2>$r/$n.err </dev/null
    echo $? >$r/$n.rc
    echo "=== $n: rc $(cat $r/$n.rc)" >/dev/console
done </etc/cmds
dmesg >$r/dmesg.txt
stty -F /dev/ttyS1 raw -echo 2>/dev/null
tar -cf /dev/ttyS1 -C $r .
sync
poweroff -f
EOF
chmod +x "$root/init"
initrd="$cache/initrd-$release-$$.cpio.gz"
(cd "$root" && find . | cpio -o -H newc --quiet | gzip -1) >"$initrd"

say "booting under TCG (console: $out/console.log)"
rm -f "$out/results.tar"
status=0
timeout "$boot_timeout" qemu-system-x86_64 \
    -accel tcg,thread=${HVLAB_TCG_THREAD:-single} -cpu EPYC,+svm,+npt -smp 2 -m 2048 \
    -display none -no-reboot -monitor none \
    -serial "file:$out/console.log" -serial "file:$out/results.tar" \
    -kernel "$vmlinuz" -initrd "$initrd" \
    -append "console=ttyS0 quiet panic=-1" </dev/null 2>"$out/qemu.err" || status=$?
rm -f "$initrd"
if [ "$status" -ne 0 ]; then
    say "qemu exited with $status (timeout: 124)"
fi
tar -xf "$out/results.tar" -C "$out" 2>/dev/null || { say "no results came back from the guest"; exit 1; }
say "done: $(ls "$out"/*.rc 2>/dev/null | wc -l) commands"
