// kube-proxy in nftables mode, Weir on the legacy iptables backend (x_tables hooks beside
// kube-proxy's nftables chains).
import { servicesSuite } from './scenarios.ts';

servicesSuite({ mode: 'nftables', backend: 'legacy' });
