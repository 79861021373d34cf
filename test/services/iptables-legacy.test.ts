// kube-proxy in iptables mode on the legacy iptables backend (x_tables), Weir on the same.
import { servicesSuite } from './scenarios.ts';

servicesSuite({ mode: 'iptables', backend: 'legacy' });
