#!/bin/sh
# Builds RocketMQ 4.9.8's NameServer, client and tools (mqadmin) with javac, without Maven,
# against Debian's jars in /usr/share/java, and prints the classpath to run them with.
#
# usage: build_rocketmq_java.sh ROCKETMQ_SRC FASTJSON_SRC OUT_DIR
#   ROCKETMQ_SRC  a tree of rocketmq-all-4.9.8 holding (at least) the modules logging, common,
#                 remoting, client, srvutil, acl, tools and namesrv
#   FASTJSON_SRC  a tree of fastjson 1.2.69 (src/main/java)
#   OUT_DIR       where the class directories go (created)
#
# Debian packages needed: default-jdk-headless libnetty-java libcommons-lang3-java
# libcommons-cli-java libcommons-validator-java libcommons-codec-java libsnakeyaml-java
# libguava-java libjoda-time-java libslf4j-java liblogback-java libzstd-jni-java liblz4-java.
set -eu
if [ $# -ne 3 ]; then
    echo "usage: $0 ROCKETMQ_SRC FASTJSON_SRC OUT_DIR" >&2
    exit 2
fi
RMQ=$(cd "$1" && pwd)
FJ=$(cd "$2" && pwd)
mkdir -p "$3"
OUT=$(cd "$3" && pwd)
JARS=/usr/share/java

deps=""
for jar in netty-buffer netty-codec netty-common netty-handler netty-resolver netty-transport \
        netty-transport-native-epoll netty-transport-native-unix-common commons-lang3 commons-cli commons-validator commons-codec commons-beanutils \
        commons-digester commons-logging commons-collections3 snakeyaml guava joda-time \
        slf4j-api logback-classic logback-core zstd-jni lz4-java; do
    [ -f "$JARS/$jar.jar" ] || { echo "missing $JARS/$jar.jar (install its Debian package)" >&2; exit 1; }
    deps="$deps:$JARS/$jar.jar"
done
deps=${deps#:}

# javac_tree NAME CLASSPATH SOURCE_ROOT [RESOURCE_ROOT]: compiles the .java files listed in
# $OUT/NAME.sources into $OUT/NAME and copies the resources beside them.
javac_tree() {
    rm -rf "${OUT:?}/$1"
    mkdir -p "$OUT/$1"
    javac -nowarn -encoding UTF-8 --release 8 -XDignore.symbol.file -proc:none \
        -cp "$2" -d "$OUT/$1" @"$OUT/$1.sources" 2>"$OUT/$1.log" \
        || { cat "$OUT/$1.log" >&2; exit 1; }
    if [ -n "${4:-}" ] && [ -d "$4" ]; then
        (cd "$4" && find . -type f -exec sh -c 'mkdir -p "$0/$(dirname "$1")" && cp "$1" "$0/$1"' "$OUT/$1" {} \;)
    fi
}

# fastjson's core; its support packages (Spring, JAX-RS, Retrofit, JavaMoney, Springfox) need
# jars Debian lacks and no RocketMQ module uses them. The core's two configs name the JavaMoney
# and Springfox codecs in branches taken only when those libraries' classes are loaded, so a
# copy of the core is built with those branches answering no codec (null) instead.
rm -rf "$OUT/fastjson-src"
cp -r "$FJ/src/main/java" "$OUT/fastjson-src"
rm -rf "$OUT/fastjson-src/com/alibaba/fastjson/support"
mkdir -p "$OUT/fastjson-src/com/alibaba/fastjson/support"
cp -r "$FJ/src/main/java/com/alibaba/fastjson/support/config" "$OUT/fastjson-src/com/alibaba/fastjson/support/"
for f in parser/ParserConfig.java serializer/SerializeConfig.java; do
    sed -i -e '/^import com\.alibaba\.fastjson\.support\.\(moneta\|springfox\)\./d' \
        -e 's/\(MonetaCodec\|SwaggerJsonSerializer\)\.instance/null/' \
        "$OUT/fastjson-src/com/alibaba/fastjson/$f"
done
find "$OUT/fastjson-src" -name '*.java' > "$OUT/fastjson.sources"
javac_tree fastjson "$deps" "$OUT/fastjson-src" "$FJ/src/main/resources"

# RocketMQ's modules in one tree: they depend on each other in a chain and build faster together.
# The client's OpenTracing hooks are left out (opentracing is not in Debian; nothing loads them
# unless a user registers one).
: > "$OUT/rocketmq.sources"
for m in logging common remoting client srvutil acl tools namesrv; do
    find "$RMQ/$m/src/main/java" -name '*.java' | grep -v 'OpenTracingHookImpl' >> "$OUT/rocketmq.sources"
done
# The ACL module's YAML loader sets a TagInspector (snakeyaml 2); Debian ships snakeyaml 1.33,
# which has no tag inspection and refuses no global tags, so the copy built here drops that
# setting. The ACL files mqadmin and the NameServer read are plain maps either way.
rm -rf "$OUT/acl-src"
cp -r "$RMQ/acl/src/main/java" "$OUT/acl-src"
sed -i -e '/^import org\.yaml\.snakeyaml\.inspector\.TagInspector;/d' \
    -e '/TagInspector tagInspector = /d' -e '/loaderOptions\.setTagInspector(/d' \
    "$OUT/acl-src/org/apache/rocketmq/acl/common/AclUtils.java"
grep -v "^$RMQ/acl/src/main/java/" "$OUT/rocketmq.sources" > "$OUT/rocketmq.sources.tmp"
find "$OUT/acl-src" -name '*.java' >> "$OUT/rocketmq.sources.tmp"
mv "$OUT/rocketmq.sources.tmp" "$OUT/rocketmq.sources"
javac_tree rocketmq "$OUT/fastjson:$deps" "$RMQ/common/src/main/java"
for m in logging common remoting client srvutil acl tools namesrv; do
    res="$RMQ/$m/src/main/resources"
    if [ -d "$res" ]; then
        (cd "$res" && find . -type f -exec sh -c 'mkdir -p "$0/$(dirname "$1")" && cp "$1" "$0/$1"' "$OUT/rocketmq" {} \;)
    fi
done

echo "$OUT/rocketmq:$OUT/fastjson:$deps"
