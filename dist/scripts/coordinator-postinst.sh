#!/bin/sh
# repronet-coordinator postinst: the service's user, its state folder and
# admin token (made once, mode 0600), then the unit: enabled and started on
# a new install, restarted on an upgrade.
set -e
if [ "$1" = "configure" ]; then
	if ! getent passwd repronet >/dev/null; then
		useradd --system --user-group --home-dir /var/lib/repronet/coordinator --no-create-home \
			--shell /usr/sbin/nologin --comment "repronet coordinator" repronet
	fi
	install -d -m 0755 /var/lib/repronet
	install -d -o repronet -g repronet -m 0750 /var/lib/repronet/coordinator
	tok=/var/lib/repronet/coordinator/admin.token
	if [ ! -e "$tok" ]; then
		umask 077
		head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$tok"
		echo >>"$tok"
		chown repronet:repronet "$tok"
		chmod 0600 "$tok"
		echo "repronet-coordinator: admin token in $tok"
	fi
	if [ -d /run/systemd/system ]; then
		systemctl daemon-reload >/dev/null || true
		if [ -z "$2" ]; then
			systemctl enable --now repronet-coordinator.service >/dev/null 2>&1 || true
		else
			systemctl try-restart repronet-coordinator.service >/dev/null || true
		fi
	fi
fi
exit 0
