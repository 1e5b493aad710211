#!/usr/bin/env bash
# Installs headless Chromium from Debian (the `chromium` package) for the
# certificate's screenshot test (internal/report), with a font to draw text.
# Idempotent: does nothing when the binary is already there. Prints its path.
#   hack/install-chromium.sh
set -euo pipefail
source "$(dirname "$0")/lib.sh"

debian=/usr/bin/chromium
chromium="${LETHE_CHROMIUM:-$debian}"
if [ -x "$chromium" ]; then
	echo "$chromium"
	exit 0
fi
[ "$chromium" = "$debian" ] ||
	die "LETHE_CHROMIUM=$chromium is not an executable: point it at a Chromium binary, or unset it to install Debian's $debian"

log "installing chromium from Debian (a minute or two)"
apt_install chromium fonts-dejavu-core
[ -x "$debian" ] || die "apt installed chromium but $debian is missing"
echo "$debian"
