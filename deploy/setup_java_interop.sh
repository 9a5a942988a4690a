#!/usr/bin/env bash
# The Java interop environment (idempotent): Apache Iceberg Java 1.10.2 on PySpark 3.5 in
# its own venv, because the project's own Spark is 4.x and Iceberg's runtime is built for 3.5.
#
# The runtime jar of `snowpark-connect-deps-iceberg` references Jackson and HttpClient 5
# relocated under org.apache.iceberg.shaded.* but does not contain them. They are supplied
# here: PySpark 3.5's own Jackson jars and Debian's HttpClient 5, relocated with Debian's
# jarjar into the names Iceberg expects. Iceberg's REST client (HTTPClient) needs HttpClient
# 5.4+ (TlsSocketStrategy) and this machine's Debian release ships 5.2, so the two packages
# are downloaded (not installed) from Debian unstable with a private apt state under the
# venv, leaving the system's apt sources untouched.
set -euo pipefail
cd "$(dirname "$0")/.."
JVENV=${JAVA_VENV:-.venv-java}
PY=${PYTHON:-python3}
lock=deploy/java-interop.lock

need_apt=()
ls /usr/lib/jvm/java-17-openjdk-*/bin/java >/dev/null 2>&1 || need_apt+=(openjdk-17-jre-headless)
[ -f /usr/share/java/jarjar.jar ] || need_apt+=(libjarjar-java)
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "setup: apt-get install ${need_apt[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi

stamp="$JVENV/.icefloe-java-installed"
want="$(cat "$lock" deploy/setup_java_interop.sh | sha256sum | cut -c1-16)"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi
echo "setup: Java interop environment in $JVENV (Iceberg Java 1.10.2 on Spark 3.5)"
[ -x "$JVENV/bin/python" ] || $PY -m venv "$JVENV"
"$JVENV/bin/pip" install -qq --upgrade pip
"$JVENV/bin/pip" install -qq -r "$lock"

site="$("$JVENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
sparkjars="$site/pyspark/jars"
icebergjars="$site/snowpark_connect_deps_iceberg/jars"
out="$JVENV/iceberg-jars"
rm -rf "$out" "$JVENV/shade-tmp"
mkdir -p "$out" "$JVENV/shade-tmp"
hc="$(cd "$JVENV/shade-tmp" && pwd)/hc"
mkdir -p "$hc/lists/partial" "$hc/cache/archives/partial"
echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian sid main" > "$hc/sources.list"
apt_private=(-o "Dir::Etc::SourceList=$hc/sources.list" -o Dir::Etc::SourceParts=/dev/null
  -o "Dir::State::Lists=$hc/lists" -o "Dir::Cache=$hc/cache" -o APT::Sandbox::User=root)
apt-get "${apt_private[@]}" update -qq
(cd "$hc" && apt-get "${apt_private[@]}" download -qq libhttpclient5-java libhttpcore5-java)
for deb in "$hc"/*.deb; do dpkg-deb -x "$deb" "$hc/root"; done
hcjars="$hc/root/usr/share/java"
cp "$icebergjars"/iceberg-spark-runtime-3.5_2.12-*.jar "$icebergjars"/iceberg-spark-extensions-3.5_2.12-*.jar "$out/"
rules="$JVENV/shade-tmp/rules.txt"
printf '%s\n' \
  'rule com.fasterxml.jackson.** org.apache.iceberg.shaded.com.fasterxml.jackson.@1' \
  'rule org.apache.hc.** org.apache.iceberg.shaded.org.apache.hc.@1' > "$rules"
for jar in "$sparkjars"/jackson-core-2.*.jar "$sparkjars"/jackson-databind-2.*.jar \
  "$sparkjars"/jackson-annotations-2.*.jar "$sparkjars"/jackson-datatype-jsr310-2.*.jar \
  "$hcjars"/httpclient5.jar "$hcjars"/httpcore5.jar "$hcjars"/httpcore5-h2.jar; do
  name="$(basename "$jar")"
  flat="$JVENV/shade-tmp/$name"
  # jarjar maps multi-release copies (META-INF/versions/N/...) onto the same names as the
  # base classes and then refuses the duplicates: keep the base (Java 8) classes only.
  "$JVENV/bin/python" - "$jar" "$flat" <<'PYEOF'
import sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as src, zipfile.ZipFile(sys.argv[2], "w", zipfile.ZIP_DEFLATED) as dst:
    for info in src.infolist():
        if not info.filename.startswith("META-INF/versions/"):
            dst.writestr(info, src.read(info))
PYEOF
  java -jar /usr/share/java/jarjar.jar process "$rules" "$flat" "$out/shaded-$name"
done
rm -rf "$JVENV/shade-tmp"
echo "$want" > "$stamp"
