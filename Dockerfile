# Weir agent image: Debian bookworm with both iptables backends, ipset, iproute2 and kmod, the
# Node 24 binary of the npm package 'node' that package-lock.json pins, and the built app in /app.
# scripts/image.sh builds the same image without Docker; test/image/spec.test.ts keeps the two in
# step (the Debian packages, where Node comes from, the entrypoint, cmd and working directory).
FROM node:24-bookworm-slim AS build
WORKDIR /src
COPY package.json package-lock.json tsconfig.json tsconfig.build.json ./
# Dev dependencies too: tsc, and the 'node' package whose binary the image ships.
RUN npm ci --no-audit --no-fund
COPY src ./src
RUN npx tsc -p tsconfig.build.json --outDir /app/dist --sourceMap false \
    && install -D -m 755 node_modules/node/bin/node /out/usr/local/bin/node
WORKDIR /app
COPY image/prune-node-modules.sh /tmp/
RUN cp /src/package.json /src/package-lock.json ./ \
    && npm ci --omit=dev --ignore-scripts --no-audit --no-fund \
    && rm package-lock.json \
    && sh /tmp/prune-node-modules.sh node_modules

FROM debian:bookworm-slim
# The packages of image/packages.
RUN apt-get update \
    && apt-get install -y --no-install-recommends iptables ipset iproute2 tcpdump kmod libstdc++6 \
    && rm -rf /var/lib/apt/lists/*
COPY --from=build /out/usr/local/bin/node /usr/local/bin/node
WORKDIR /app
COPY --from=build /app ./
COPY examples ./examples
ENTRYPOINT ["node", "/app/dist/cli/main.js"]
CMD ["agent"]
